// The live board: counts per status and stage, the newest pipelines filtered by status, stage or a
// search, kept up to date from the stream of every pipeline's timeline entries (no reload). A pipeline whose
// draft waits for a review says for how long, and a link lists only those.

import { call, problem } from "./api.js";
import { fill, h } from "./dom.js";
import * as format from "./format.js";
import { t } from "./i18n.js";
import { AWAITING_REVIEW, ENDED, IN_FLIGHT, STAGES, STATUSES, badge, countCell, isEnded, progressBar } from "./model.js";
import { follow } from "./sse.js";

const PAGE = 50;
const HEADINGS = ["board.customer", "board.status", "board.stage", "board.progress", "board.created", "board.updated", "board.id"];
const COUNTS_EVERY_MS = 2000; // an admin's counts come from /v1/stats, read again at most this often
const AGES_EVERY_MS = 15000; // how often the reviews' waiting times are written again

function itemOf(view) {
  return {
    id: view.id,
    customer: view.brief.customer_name,
    region: view.brief.region,
    status: view.status,
    stage: view.current_stage,
    progress: view.progress,
    created: view.created_at,
    updated: view.updated_at,
    waitingSince: view.status === AWAITING_REVIEW ? view.review?.draft?.drafted_at ?? view.updated_at : null,
  };
}

/** How long a draft has waited for a review, beside the pipeline's status. */
function waited(since) {
  return h("small", { class: "waited", "data-testid": "review-age", "data-since": since }, t("board.waited", { time: format.age(since) }));
}

function isId(text) {
  return /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(text.trim());
}

export function render(root, { params, may, go }) {
  const filters = { status: params.get("status") || "", stage: params.get("stage") || "", q: params.get("q") || "" };
  const items = new Map(); // pipeline id -> item
  const fetching = new Set();
  let nextCursor = null;
  let stats = null;
  let countsTimer = null;
  let countsDue = false;

  const live = h("span", { class: "live", "data-testid": "live", "data-state": "connecting" }, t("live.connecting"));
  const counts = h("section", { class: "counts", "data-testid": "counts" });
  const body = h("tbody", { "data-testid": "pipelines" });
  const more = h("button", { type: "button", hidden: true, "data-testid": "more" }, t("board.more"));
  const notice = h("p", { class: "problem", role: "alert" });

  function matches(item) {
    if (filters.status && item.status !== filters.status) return false;
    if (filters.stage && item.stage !== filters.stage) return false;
    if (filters.q) {
      const q = filters.q.trim();
      if (isId(q)) return item.id === q.toLowerCase();
      return item.customer.toLowerCase().includes(q.toLowerCase());
    }
    return true;
  }

  function row(item, changed) {
    return h(
      "tr",
      { "data-pipeline-id": item.id, "data-status": item.status, class: changed ? "changed" : null },
      h(
        "td",
        {},
        h("a", { href: `#/pipelines/${item.id}`, class: "customer" }, item.customer),
        h("small", { class: "region" }, item.region),
      ),
      h("td", {}, badge(item.status), item.status === AWAITING_REVIEW && item.waitingSince && waited(item.waitingSince)),
      // On a phone a row is a card, whose cells say what they are (console.css).
      h("td", { "data-label": t("board.stage") }, item.stage ? t(`stage.${item.stage}`) : "–"),
      h("td", {}, progressBar(item.progress)),
      h("td", { "data-label": t("board.created") }, format.dateTime(item.created)),
      h("td", { "data-label": t("board.updated") }, format.time(item.updated)),
      h("td", { class: "id", "data-label": t("board.id") }, format.shortId(item.id)),
    );
  }

  function newestFirst() {
    return [...items.values()].sort((a, b) => Date.parse(b.created) - Date.parse(a.created));
  }

  function show(changedId = null) {
    const shown = newestFirst();
    if (!shown.length) {
      fill(body, h("tr", { class: "empty" }, h("td", { colspan: 7 }, t("board.empty"))));
      return;
    }
    const existing = new Map([...body.querySelectorAll("tr[data-pipeline-id]")].map((tr) => [tr.dataset.pipelineId, tr]));
    fill(body, shown.map((item) => (item.id === changedId || !existing.has(item.id) ? row(item, item.id === changedId) : existing.get(item.id))));
  }

  function put(item, changed) {
    if (matches(item)) items.set(item.id, item);
    else items.delete(item.id);
    show(changed ? item.id : null);
    countsChanged();
  }

  async function load(cursor = null) {
    try {
      const page = await call("/v1/pipelines", { params: { ...filters, limit: PAGE, cursor } });
      for (const view of page.items) items.set(view.id, itemOf(view));
      nextCursor = page.next_cursor;
      more.hidden = nextCursor === null;
      notice.textContent = "";
      show();
      countsChanged();
    } catch (error) {
      notice.textContent = problem(error);
    }
  }

  /** A pipeline the board has not loaded, whose entry matched: read it, and show it unless it belongs on a
   * later page (older than the oldest shown while more pages follow). */
  async function fetchItem(id) {
    if (fetching.has(id)) return;
    fetching.add(id);
    try {
      const item = itemOf(await call(`/v1/pipelines/${id}`));
      const oldest = newestFirst().at(-1);
      if (nextCursor !== null && oldest && Date.parse(item.created) < Date.parse(oldest.created)) return;
      put(item, true);
    } catch (error) {
      notice.textContent = problem(error);
    } finally {
      fetching.delete(id);
    }
  }

  function onEntry(entry) {
    const known = items.get(entry.pipeline_id);
    const stage = STAGES.includes(entry.step) ? entry.step : null;
    if (known) {
      let waitingSince = null;
      if (entry.pipeline_status === AWAITING_REVIEW) waitingSince = entry.status === "drafted" ? entry.time : known.waitingSince ?? entry.time;
      put({ ...known, status: entry.pipeline_status, progress: entry.progress, stage: stage ?? known.stage, updated: entry.time, waitingSince }, true);
    } else if (entry.status === "requested") {
      // A new pipeline: its entry says all the board shows of it.
      const item = {
        id: entry.pipeline_id,
        customer: entry.customer_name,
        region: entry.region,
        status: entry.pipeline_status,
        stage: null,
        progress: entry.progress,
        created: entry.time,
        updated: entry.time,
        waitingSince: null,
      };
      if (matches(item)) put(item, true);
    } else if (matches({ id: entry.pipeline_id, customer: entry.customer_name, status: entry.pipeline_status, stage })) {
      fetchItem(entry.pipeline_id);
    } else {
      countsChanged();
    }
  }

  function showCounts() {
    if (stats) {
      const p = stats.pipelines;
      fill(
        counts,
        h("div", { class: "group" }, h("h3", {}, t("board.in_flight")), IN_FLIGHT.map((s) => countCell(`status-${s}`, p.in_flight_by_status[s] || 0, t(`status.${s}`)))),
        h("div", { class: "group" }, h("h3", {}, t("board.ended_hour")), ENDED.map((s) => countCell(`status-${s}`, p.finished[s] || 0, t(`status.${s}`)))),
        stats.stages.map((s) =>
          h(
            "div",
            { class: "group" },
            h("h3", {}, t(`stage.${s.stage}`)),
            countCell(`${s.stage}-pending`, s.pending, t("board.waiting")),
            countCell(`${s.stage}-running`, s.running, t("board.running")),
            countCell(`${s.stage}-retry`, s.retry_waiting, t("board.retry_waiting")),
          ),
        ),
      );
      return;
    }
    // Without admin: counts of the pipelines shown.
    const shown = [...items.values()];
    const by = (test) => shown.filter(test).length;
    fill(
      counts,
      h("div", { class: "group" }, h("h3", {}, t("board.shown")), STATUSES.map((s) => countCell(`status-${s}`, by((i) => i.status === s), t(`status.${s}`)))),
      h(
        "div",
        { class: "group" },
        h("h3", {}, t("board.at_stage")),
        STAGES.map((stage) => countCell(`${stage}-at`, by((i) => i.stage === stage && !isEnded(i.status)), t(`stage.${stage}`))),
      ),
    );
  }

  async function readStats() {
    try {
      stats = await call("/v1/stats", { params: { window: "1h" } });
      showCounts();
    } catch (error) {
      notice.textContent = problem(error);
    }
  }

  function countsChanged() {
    if (!may("admin")) {
      showCounts();
      return;
    }
    if (countsTimer !== null) {
      countsDue = true;
      return;
    }
    readStats();
    countsTimer = setTimeout(function again() {
      countsTimer = null;
      if (countsDue) {
        countsDue = false;
        countsChanged();
      }
    }, COUNTS_EVERY_MS);
  }

  const status = h("select", { name: "status", "data-testid": "filter-status" }, h("option", { value: "" }, t("board.any_status")), STATUSES.map((s) => h("option", { value: s, selected: s === filters.status }, t(`status.${s}`))));
  const stage = h("select", { name: "stage", "data-testid": "filter-stage" }, h("option", { value: "" }, t("board.any_stage")), STAGES.map((s) => h("option", { value: s, selected: s === filters.stage }, t(`stage.${s}`))));
  const search = h("input", { type: "search", name: "q", value: filters.q, maxlength: 80, placeholder: t("board.search_hint"), "data-testid": "search" });
  const reviews = h("a", { href: `#/board?status=${AWAITING_REVIEW}`, class: "reviews-link", "data-testid": "filter-reviews" }, t("board.reviews"));
  const form = h("form", { class: "filters" }, status, stage, search, h("button", { type: "submit" }, t("board.search")), reviews);
  const apply = (event) => {
    event?.preventDefault();
    const query = new URLSearchParams();
    for (const [name, value] of [["status", status.value], ["stage", stage.value], ["q", search.value.trim()]]) {
      if (value) query.set(name, value);
    }
    go(`#/board${query.size ? `?${query}` : ""}`);
  };
  form.addEventListener("submit", apply);
  status.addEventListener("change", apply);
  stage.addEventListener("change", apply);
  more.addEventListener("click", () => load(nextCursor));

  root.append(
    h("div", { class: "title" }, h("h1", {}, t("nav.board")), live),
    counts,
    form,
    notice,
    h("table", { class: "pipelines" }, h("thead", {}, h("tr", {}, HEADINGS.map((key) => h("th", {}, t(key))))), body),
    more,
  );

  // The list is read once the stream is open: the stream starts after the newest entry when it opens, so
  // whatever changes after the list was read comes on the stream.
  let loaded = false;
  const stream = follow("/v1/events", {
    onEvent: (event) => {
      if (event.event === "entry") onEntry(JSON.parse(event.data));
    },
    onState: (state) => {
      live.dataset.state = state;
      live.textContent = t(`live.${state}`);
      if (!loaded) {
        loaded = true;
        load();
      }
    },
  });
  const ages = setInterval(() => {
    for (const shown of body.querySelectorAll("[data-since]")) shown.textContent = t("board.waited", { time: format.age(shown.dataset.since) });
  }, AGES_EVERY_MS);
  return () => {
    stream.close();
    clearTimeout(countsTimer);
    clearInterval(ages);
  };
}
