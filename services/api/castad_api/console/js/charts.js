// Charts as inline SVG, drawn from numbers with the DOM (no library): a line chart over time and
// horizontal bars per group. Colours come from the stylesheet, by the series' key.

import { h, svg } from "./dom.js";

const WIDTH = 640; // of a bar chart; a line chart spans the page (LINE_WIDTH), in the same units of about a pixel
const LINE_WIDTH = 1200;
const PAD = { left: 56, right: 16, top: 12, bottom: 28 };

/** The smallest round number (1, 2, 2.5 or 5 times a power of ten) at or above `value`. */
export function roundUp(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (step * power >= value * (1 - 1e-9)) return step * power;
  }
  return 10 * power;
}

function legend(series) {
  return h("ul", { class: "legend" }, series.map((s) => h("li", { class: `key-${s.key}` }, s.label)));
}

function figure(key, title, drawing, series) {
  return h("figure", { class: "chart", "data-chart": key }, h("figcaption", {}, title), drawing, series && legend(series));
}

/** Lines over `labels` (one per point, e.g. bucket times): series [{key, label, values}]. */
export function lineChart({ key, title, labels, series, format = String }) {
  const height = 240;
  const innerWidth = LINE_WIDTH - PAD.left - PAD.right;
  const innerHeight = height - PAD.top - PAD.bottom;
  const max = roundUp(Math.max(0, ...series.flatMap((s) => s.values)));
  const x = (i) => PAD.left + (labels.length > 1 ? (i * innerWidth) / (labels.length - 1) : innerWidth / 2);
  const y = (value) => PAD.top + innerHeight - (value / max) * innerHeight;
  const grid = [0, 0.5, 1].map((share) => [
    svg("line", { class: "grid", x1: PAD.left, x2: LINE_WIDTH - PAD.right, y1: y(max * share), y2: y(max * share) }),
    svg("text", { class: "axis", x: PAD.left - 6, y: y(max * share) + 4, "text-anchor": "end" }, format(max * share)),
  ]);
  const shown = [...new Set([0, Math.floor((labels.length - 1) / 2), labels.length - 1])].filter((i) => i >= 0);
  const anchor = (i) => (labels.length === 1 ? "middle" : i === 0 ? "start" : i === labels.length - 1 ? "end" : "middle");
  const ticks = shown.map((i) => svg("text", { class: "axis", x: x(i), y: height - 8, "text-anchor": anchor(i) }, labels[i]));
  const lines = series.map((s) =>
    svg(
      "g",
      { class: `series key-${s.key}` },
      svg("polyline", { points: s.values.map((v, i) => `${x(i)},${y(v)}`).join(" ") }),
      s.values.length <= 90 && s.values.map((v, i) => svg("circle", { cx: x(i), cy: y(v), r: 2.5 })),
    ),
  );
  const drawing = svg(
    "svg",
    { viewBox: `0 0 ${LINE_WIDTH} ${height}`, role: "img", "aria-label": title },
    grid,
    ticks,
    lines,
  );
  return figure(key, title, drawing, series);
}

/** Horizontal bars per group: groups [{label, bars: [{key, value}]}] (a null value: no bar, a dash);
 * `series` [{key, label}] names the bars in the legend. */
export function barChart({ key, title, groups, series, format = String, max = null }) {
  const labelWidth = 96;
  const bar = 14;
  const gap = 4;
  const groupGap = 14;
  const innerWidth = WIDTH - labelWidth - PAD.right - 64; // room for the value after the bar
  const top = max ?? roundUp(Math.max(0, ...groups.flatMap((g) => g.bars.map((b) => b.value ?? 0))));
  const rows = [];
  let y = PAD.top;
  for (const group of groups) {
    const groupHeight = group.bars.length * (bar + gap) - gap;
    rows.push(svg("text", { class: "label", x: labelWidth - 8, y: y + groupHeight / 2 + 4, "text-anchor": "end" }, group.label));
    for (const b of group.bars) {
      const width = b.value === null ? 0 : Math.max((b.value / top) * innerWidth, b.value > 0 ? 1 : 0);
      rows.push(
        svg("rect", { class: `bar key-${b.key}`, x: labelWidth, y, width, height: bar }),
        svg("text", { class: "value", x: labelWidth + width + 6, y: y + bar - 3 }, b.value === null ? "–" : format(b.value)),
      );
      y += bar + gap;
    }
    y += groupGap - gap;
  }
  const height = y + PAD.bottom - groupGap;
  const axis = svg("line", { class: "grid", x1: labelWidth, x2: labelWidth, y1: PAD.top - 4, y2: height - PAD.bottom + 4 });
  const drawing = svg("svg", { viewBox: `0 0 ${WIDTH} ${height}`, role: "img", "aria-label": title }, axis, rows);
  return figure(key, title, drawing, series);
}
