// The numbers over a window (admin): pipelines in flight and ended, throughput per minute, each stage's
// failure rate and durations, errors by code, stuck attempts and dead letters; read again every 15 s.

import { call, problem } from "./api.js";
import { barChart, lineChart } from "./charts.js";
import { fill, h } from "./dom.js";
import * as format from "./format.js";
import { t } from "./i18n.js";
import { ENDED, IN_FLIGHT, countCell } from "./model.js";

const WINDOWS = ["15m", "1h", "24h", "7d"];
const EVERY_MS = 15000;
const OUTCOMES = ["created", "succeeded", "failed", "canceled"];
const PERCENTILES = ["p50", "p95", "p99"];

export function render(root, { params, go }) {
  const span = WINDOWS.includes(params.get("window")) ? params.get("window") : "1h";
  const body = h("div", { class: "stats", "data-testid": "stats" });
  const notice = h("p", { class: "problem", role: "alert" });
  const picker = h(
    "div",
    { class: "windows", role: "group", "aria-label": t("stats.window") },
    WINDOWS.map((w) =>
      h("button", { type: "button", class: w === span ? "selected" : null, "aria-pressed": String(w === span), "data-window": w, onclick: () => go(`#/stats?window=${w}`) }, t(`window.${w}`)),
    ),
  );

  function draw(stats) {
    const p = stats.pipelines;
    const perMinute = 60 / stats.throughput.bucket_s;
    const buckets = stats.throughput.buckets;
    const throughput = lineChart({
      key: "throughput",
      title: t("stats.throughput"),
      labels: buckets.map((b) => format.time(b.start)),
      series: OUTCOMES.map((o) => ({ key: o, label: t(`stats.${o}`), values: buckets.map((b) => b[o] * perMinute) })),
      format: (v) => format.number(v, 1),
    });
    const stages = stats.stages.map((s) => ({ label: t(`stage.${s.stage}`), s }));
    const failures = barChart({
      key: "failure-rate",
      title: t("stats.failure_rate"),
      groups: stages.map(({ label, s }) => ({ label, bars: [{ key: "failed", value: s.failure_rate }] })),
      max: 1,
      format: format.percent,
    });
    const durations = barChart({
      key: "durations",
      title: t("stats.durations"),
      groups: stages.map(({ label, s }) => ({ label, bars: PERCENTILES.map((q) => ({ key: q, value: s.duration_s ? s.duration_s[q] : null })) })),
      series: PERCENTILES.map((q) => ({ key: q, label: q })),
      format: format.seconds,
    });
    const errors = stats.stages.flatMap((s) => s.errors.map((e) => ({ stage: s.stage, ...e })));
    fill(
      body,
      h(
        "section",
        { class: "counts" },
        h("div", { class: "group" }, h("h3", {}, t("board.in_flight")), IN_FLIGHT.map((s) => countCell(`status-${s}`, p.in_flight_by_status[s] || 0, t(`status.${s}`)))),
        h("div", { class: "group" }, h("h3", {}, t("stats.ended")), ENDED.map((s) => countCell(`status-${s}`, p.finished[s] || 0, t(`status.${s}`)))),
        h(
          "div",
          { class: "group" },
          h("h3", {}, t("stats.window_totals")),
          countCell("created", p.created, t("stats.created")),
          countCell("dead-letters", Object.values(stats.dead_letters.open).reduce((a, b) => a + b, 0), t("nav.dead_letters")),
          countCell("stuck", stats.stuck.length, t("stats.stuck")),
        ),
      ),
      h("div", { class: "charts" }, throughput, failures, durations),
      h(
        "section",
        {},
        h("h2", {}, t("stats.stages")),
        h(
          "table",
          { "data-testid": "stage-stats" },
          h("thead", {}, h("tr", {}, ["pipeline.stage", "board.waiting", "board.running", "board.retry_waiting", "stats.stuck", "status.SUCCEEDED", "status.FAILED", "status.CANCELED", "stats.attempts", "stats.attempt_p95"].map((k) => h("th", {}, t(k))))),
          h(
            "tbody",
            {},
            stats.stages.map((s) =>
              h(
                "tr",
                { "data-stage": s.stage },
                [t(`stage.${s.stage}`), s.pending, s.running, s.retry_waiting, s.stuck, s.succeeded, s.failed, s.canceled, s.attempts].map((v) => h("td", {}, typeof v === "number" ? format.number(v) : v)),
                h("td", {}, format.seconds(s.attempt_duration_s?.p95)),
              ),
            ),
          ),
        ),
      ),
      errors.length > 0 &&
        h(
          "section",
          {},
          h("h2", {}, t("stats.errors")),
          h(
            "table",
            {},
            h("thead", {}, h("tr", {}, ["pipeline.stage", "pipeline.code", "stats.count", "stats.share"].map((k) => h("th", {}, t(k))))),
            h("tbody", {}, errors.map((e) => h("tr", {}, h("td", {}, t(`stage.${e.stage}`)), h("td", {}, h("code", {}, e.code)), h("td", {}, format.number(e.count)), h("td", {}, format.percent(e.rate))))),
          ),
        ),
      stats.stuck.length > 0 &&
        h(
          "section",
          {},
          h("h2", {}, t("stats.stuck")),
          h(
            "ul",
            {},
            stats.stuck.map((a) => h("li", {}, h("a", { href: `#/pipelines/${a.pipeline_id}` }, format.shortId(a.pipeline_id)), ` ${t(`stage.${a.stage}`)} #${a.attempt} · ${a.worker || "–"} · ${format.seconds(a.running_s)}`)),
          ),
        ),
      h("p", { class: "note" }, t("stats.read_at", { time: format.dateTime(stats.at), since: format.dateTime(stats.since) })),
    );
  }

  async function read() {
    try {
      draw(await call("/v1/stats", { params: { window: span } }));
      notice.textContent = "";
    } catch (error) {
      notice.textContent = problem(error);
    }
  }

  root.append(h("div", { class: "title" }, h("h1", {}, t("nav.stats")), picker), notice, body);
  read();
  const timer = setInterval(read, EVERY_MS);
  return () => clearInterval(timer);
}
