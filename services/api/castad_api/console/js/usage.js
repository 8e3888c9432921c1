// What tenants used (GET /v1/usage), per UTC day: a span of days (this month by default), the estimated cost and
// the seconds of song per day as charts, every meter per day and tenant with the total, and, when one tenant is
// shown, its budgets and its weight. A key with `read` sees its own tenant's; an admin key every tenant's, or one.

import { call, problem } from "./api.js";
import { lineChart } from "./charts.js";
import { fill, h } from "./dom.js";
import * as format from "./format.js";
import { t, tOr } from "./i18n.js";

const DAY_MS = 86400000;
const LINES = 6; // tenants with a line of their own in a chart; the others are summed into one
const LIMITS = [
  { limit: "pipelines", used: "pipelines" },
  { limit: "song_seconds", used: "song_seconds" },
  { limit: "cost", used: "estimated_cost" },
];
const known = new Set(); // tenants seen in answers, offered by the admin's tenant filter

function isoDay(time) {
  return new Date(time).toISOString().slice(0, 10);
}

/** Every UTC day from `first` to `last` (YYYY-MM-DD both), in order. */
function daysFrom(first, last) {
  const days = [];
  for (let time = Date.parse(`${first}T00:00:00Z`); time <= Date.parse(`${last}T00:00:00Z`); time += DAY_MS) days.push(isoDay(time));
  return days;
}

/** Seconds of song or video: whole ones in s, min or h as format.seconds writes them (never ms). */
function mediaSeconds(value) {
  return value < 1 ? `${format.number(value, 1)} s` : format.seconds(value);
}

/** The tenants of the answer, those that used the most first (by cost, then song seconds, then pipelines). */
function ranked(days) {
  const totals = new Map();
  for (const day of days) {
    const sum = totals.get(day.tenant) || { cost: 0, song: 0, pipelines: 0 };
    sum.cost += day.estimated_cost;
    sum.song += day.song_seconds;
    sum.pipelines += day.pipelines;
    totals.set(day.tenant, sum);
  }
  return [...totals.entries()].sort(([an, a], [bn, b]) => b.cost - a.cost || b.song - a.song || b.pipelines - a.pipelines || an.localeCompare(bn)).map(([name]) => name);
}

/** A line per tenant of the first LINES, the rest summed: [{key, label, values}] over `labels` (days). */
function seriesOf(usage, labels, meter) {
  const tenants = ranked(usage.days);
  const own = tenants.slice(0, LINES);
  const others = tenants.slice(LINES);
  const at = new Map(labels.map((day, i) => [day, i]));
  const series = own.map((tenant, i) => ({ key: `tenant-${i}`, label: tenant, values: labels.map(() => 0) }));
  if (others.length) series.push({ key: "others", label: t("usage.others", { n: others.length }), values: labels.map(() => 0) });
  if (!series.length) series.push({ key: "tenant-0", label: usage.tenant ?? t("usage.all_tenants"), values: labels.map(() => 0) });
  for (const day of usage.days) {
    const line = own.indexOf(day.tenant);
    const values = series[line === -1 ? series.length - 1 : line].values;
    if (at.has(day.day)) values[at.get(day.day)] += day[meter];
  }
  return series;
}

export function render(root, { params, may, go }) {
  const admin = may("admin");
  const to = params.get("to") || isoDay(Date.now());
  const asked = {
    from: params.get("from") || `${to.slice(0, 8)}01`, // as the gateway's default: the first of the last day's month
    to,
    tenant: admin ? (params.get("tenant") || "").trim() : "",
  };
  const money = (currency) => (value) => format.money(value, currency);
  const notice = h("p", { class: "problem", role: "alert", "data-testid": "usage-error" });
  const body = h("div", { class: "usage", "data-testid": "usage" }, h("p", { class: "note" }, t("pipeline.loading")));
  const inputs = {
    from: h("input", { type: "date", name: "from", value: asked.from, required: true, "data-testid": "usage-from" }),
    to: h("input", { type: "date", name: "to", value: asked.to, required: true, "data-testid": "usage-to" }),
  };
  const tenants = h("datalist", { id: "usage-tenants" });
  if (admin) {
    inputs.tenant = h("input", { type: "search", name: "tenant", value: asked.tenant, list: "usage-tenants", maxlength: 200, placeholder: t("usage.all_tenants"), "aria-label": t("usage.tenant"), "data-testid": "usage-tenant" });
  }
  const form = h(
    "form",
    { class: "filters usage-span" },
    h("label", {}, t("usage.from"), " ", inputs.from),
    h("label", {}, t("usage.to"), " ", inputs.to),
    inputs.tenant && h("label", {}, t("usage.tenant"), " ", inputs.tenant, tenants),
    h("button", { type: "submit", "data-testid": "usage-show" }, t("usage.show")),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [name, input] of Object.entries(inputs)) if (input.value.trim()) query.set(name, input.value.trim());
    go(`#/usage${query.size ? `?${query}` : ""}`);
  });

  function tenantCell(name) {
    // An admin looking at every tenant goes to one tenant's usage (its budgets, its weight) from its name.
    if (!admin || asked.tenant) return name;
    const query = new URLSearchParams({ from: asked.from, to: asked.to, tenant: name });
    return h("a", { href: `#/usage?${query}` }, name);
  }

  function meterCells(meters, currency) {
    const cell = (meter, text) => h("td", { "data-meter": meter }, text);
    return [
      cell("pipelines", format.number(meters.pipelines)),
      cell("calls", `${format.number(meters.lyric_calls)} / ${format.number(meters.song_calls)} / ${format.number(meters.video_calls)}`),
      cell("song_seconds", mediaSeconds(meters.song_seconds)),
      cell("video_seconds", mediaSeconds(meters.video_seconds)),
      cell("stored_bytes", format.bytes(meters.stored_bytes)),
      cell("estimated_cost", format.money(meters.estimated_cost, currency)),
    ];
  }

  function table(usage) {
    const headings = ["usage.day", "usage.tenant", "usage.pipelines", "usage.calls", "usage.song_seconds", "usage.video_seconds", "usage.stored_bytes", "usage.estimated_cost"];
    const rows = usage.days.map((day) =>
      h("tr", { "data-day": day.day, "data-tenant": day.tenant }, h("td", {}, format.day(day.day)), h("td", {}, tenantCell(day.tenant)), meterCells(day, usage.currency)),
    );
    if (!rows.length) rows.push(h("tr", { class: "empty" }, h("td", { colspan: headings.length }, t("usage.empty"))));
    return h(
      "table",
      { class: "usage-days", "data-testid": "usage-days" },
      h("thead", {}, h("tr", {}, headings.map((k) => h("th", {}, t(k))))),
      h("tbody", {}, rows),
      h("tfoot", {}, h("tr", { "data-testid": "usage-total" }, h("th", { colspan: 2 }, t("usage.total")), meterCells(usage.total, usage.currency))),
    );
  }

  function budgetRows(usage) {
    const rows = usage.budgets.flatMap((budget) =>
      LIMITS.filter(({ limit }) => budget[limit] !== null).map(({ limit, used }) => {
        const cap = budget[limit];
        const spent = budget.used[used];
        const share = cap > 0 ? spent / cap : spent > 0 ? 1 : 0;
        const amount = limit === "cost" ? money(usage.currency) : limit === "song_seconds" ? mediaSeconds : (v) => format.number(v);
        return h(
          "tr",
          { "data-period": budget.period, "data-limit": limit, "data-reached": String(share >= 1) },
          h("td", {}, t(`usage.period.${budget.period}`)),
          h("td", {}, t(`usage.${limit}`)),
          h("td", {}, amount(cap)),
          h("td", {}, amount(spent)),
          h("td", { class: "share" }, h("progress", { max: 1, value: Math.min(share, 1), "data-testid": "budget-share" }), " ", format.percent(share)),
          h("td", {}, format.dateTime(budget.resets_at), h("small", { class: "in" }, t("usage.resets_in", { time: format.span((Date.parse(budget.resets_at) - Date.now()) / 1000) }))),
        );
      }),
    );
    if (!rows.length) return h("p", { class: "note", "data-testid": "no-budget" }, t("usage.no_budget"));
    return h(
      "table",
      { class: "budgets", "data-testid": "budgets" },
      h("thead", {}, h("tr", {}, ["usage.period", "usage.limit_of", "usage.limit", "usage.used", "usage.share", "usage.resets_at"].map((k) => h("th", {}, t(k))))),
      h("tbody", {}, rows),
    );
  }

  function prices(usage) {
    const set = Object.entries(usage.prices).filter(([, price]) => price > 0);
    if (!set.length) return t("usage.no_prices");
    const listed = set
      .map(([meter, price]) => {
        const amount = format.money(price, usage.currency);
        // A meter the gateway adds later, before the console names it: its code and its price.
        return tOr(`usage.price.${meter}`, null) === null ? `${meter} ${amount}` : t(`usage.price.${meter}`, { price: amount });
      })
      .join(" · ");
    return t("usage.prices", { prices: listed });
  }

  function draw(usage) {
    for (const day of usage.days) known.add(day.tenant);
    fill(tenants, [...known].sort().map((name) => h("option", { value: name })));
    const labels = daysFrom(usage.from, usage.to);
    const dayLabels = labels.map((day) => format.day(day, true));
    const cost = lineChart({ key: "usage-cost", title: t("usage.cost_per_day", { currency: usage.currency }), labels: dayLabels, series: seriesOf(usage, labels, "estimated_cost"), format: money(usage.currency) });
    const song = lineChart({ key: "usage-song-seconds", title: t("usage.song_per_day"), labels: dayLabels, series: seriesOf(usage, labels, "song_seconds"), format: mediaSeconds });
    const whose = usage.tenant ?? t("usage.all_tenants");
    fill(
      body,
      h("p", { class: "note", "data-testid": "usage-whose" }, t("usage.whose", { tenant: whose, from: format.day(usage.from), to: format.day(usage.to) }), " ", prices(usage)),
      h("div", { class: "charts" }, cost, song),
      h("section", {}, h("h2", {}, t("usage.per_day")), table(usage)),
      usage.tenant !== null &&
        h(
          "section",
          { class: "tenant-limits", "data-testid": "tenant-limits" },
          h("h2", {}, t("usage.budgets_of", { tenant: usage.tenant })),
          h("p", { "data-testid": "usage-weight" }, t("usage.weight", { weight: format.number(usage.weight) })),
          budgetRows(usage),
        ),
    );
  }

  async function read() {
    for (const input of Object.values(inputs)) input.removeAttribute("aria-invalid");
    try {
      draw(await call("/v1/usage", { params: asked }));
      notice.textContent = "";
    } catch (error) {
      const said = problem(error);
      // A refused span names the field (query.from, query.to): marked on its input, said with its label.
      const fields = (error.fields || []).filter((f) => f.loc[0] === "query" && f.loc[1] in inputs);
      for (const f of fields) inputs[f.loc[1]].setAttribute("aria-invalid", "true");
      notice.textContent = fields.length ? fields.map((f) => `${t(`usage.${f.loc[1]}`)}: ${f.msg}`).join("; ") : said;
      fill(body);
    }
  }

  root.append(h("div", { class: "title" }, h("h1", {}, t("nav.usage"))), form, notice, body);
  read();
  return null;
}
