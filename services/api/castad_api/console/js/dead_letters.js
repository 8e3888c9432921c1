// Dead letters (admin): messages no queue could handle and outbox rows the relay parked; a list with
// filters, and each one with its reason, headers, body and the actions on it, to replay or discard.

import { call, problem } from "./api.js";
import { confirmAction } from "./dialog.js";
import { definition as field, fill, h } from "./dom.js";
import * as format from "./format.js";
import { t } from "./i18n.js";
import { LETTER_STATUSES } from "./vocabulary.js";

const FILTERS = ["status", "service", "event_type", "reason", "pipeline_id"];
const PAGE = 50;

function letterBadge(status, testid = null) {
  return h("span", { class: `badge letter-${status}`, "data-status": status, "data-testid": testid }, t(`letter.${status}`));
}

function pipelineLink(pipelineId) {
  if (!pipelineId) return "–";
  // Only an id of ours becomes a link; anything else a message claimed is shown as text.
  if (!/^[0-9a-f-]{36}$/.test(pipelineId)) return pipelineId;
  return h("a", { href: `#/pipelines/${pipelineId}` }, format.shortId(pipelineId));
}

export function list(root, { params, go }) {
  const filters = Object.fromEntries(FILTERS.map((name) => [name, params.get(name) || ""]));
  const body = h("tbody", { "data-testid": "dead-letters" });
  const notice = h("p", { class: "problem", role: "alert" });
  const more = h("button", { type: "button", hidden: true }, t("board.more"));
  let nextCursor = null;

  function row(letter) {
    return h(
      "tr",
      { "data-letter-id": letter.id, "data-status": letter.status },
      h("td", {}, h("a", { href: `#/dead-letters/${letter.id}` }, `#${letter.id}`)),
      h("td", {}, format.dateTime(letter.received_at)),
      h("td", {}, t(`kind.${letter.kind}`)),
      h("td", {}, letterBadge(letter.status)),
      h("td", {}, letter.service || "–"),
      h("td", {}, letter.event_type || "–"),
      h("td", { class: "message" }, letter.reason),
      h("td", {}, pipelineLink(letter.pipeline_id)),
      h("td", {}, format.number(letter.replays)),
    );
  }

  async function load(cursor = null) {
    try {
      const page = await call("/v1/dead-letters", { params: { ...filters, limit: PAGE, cursor } });
      if (cursor === null) fill(body);
      body.append(...page.items.map(row));
      if (!body.children.length) body.append(h("tr", { class: "empty" }, h("td", { colspan: 9 }, t("letters.empty"))));
      nextCursor = page.next_cursor;
      more.hidden = nextCursor === null;
    } catch (error) {
      notice.textContent = problem(error);
    }
  }

  const inputs = {
    status: h("select", { name: "status" }, h("option", { value: "" }, t("letters.any_status")), LETTER_STATUSES.map((s) => h("option", { value: s, selected: s === filters.status }, t(`letter.${s}`)))),
    service: h("input", { name: "service", value: filters.service, placeholder: t("letters.service"), maxlength: 200 }),
    event_type: h("input", { name: "event_type", value: filters.event_type, placeholder: t("letters.event_type"), maxlength: 200 }),
    reason: h("input", { name: "reason", value: filters.reason, placeholder: t("letters.reason"), maxlength: 200 }),
    pipeline_id: h("input", { name: "pipeline_id", value: filters.pipeline_id, placeholder: t("letters.pipeline"), maxlength: 200 }),
  };
  const form = h("form", { class: "filters" }, Object.values(inputs), h("button", { type: "submit" }, t("board.search")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [name, input] of Object.entries(inputs)) if (input.value.trim()) query.set(name, input.value.trim());
    go(`#/dead-letters${query.size ? `?${query}` : ""}`);
  });
  inputs.status.addEventListener("change", () => form.requestSubmit());
  more.addEventListener("click", () => load(nextCursor));

  const headings = ["letters.id", "letters.received", "letters.kind", "board.status", "letters.service", "letters.event_type", "letters.reason", "letters.pipeline", "letters.replays"];
  root.append(
    h("div", { class: "title" }, h("h1", {}, t("nav.dead_letters"))),
    form,
    notice,
    h("table", { class: "letters" }, h("thead", {}, h("tr", {}, headings.map((k) => h("th", {}, t(k))))), body),
    more,
  );
  load();
}

export function detail(root, { arg: id, may }) {
  const content = h("div", { class: "letter" });
  const result = h("p", { class: "notice", role: "status", "data-testid": "action-result" });

  function draw(letter) {
    const buttons = [];
    if (may("admin") && letter.status !== "discarded") {
      buttons.push(h("button", { type: "button", class: "primary", "data-testid": "replay", onclick: () => replay(letter) }, t("letters.replay")));
    }
    if (may("admin") && letter.status === "dead") {
      buttons.push(h("button", { type: "button", class: "danger", "data-testid": "discard", onclick: () => discard(letter) }, t("letters.discard")));
    }
    fill(
      content,
      h("div", { class: "title" }, h("h1", {}, t("letters.one", { id: letter.id })), letterBadge(letter.status, "letter-status")),
      h("div", { class: "actions" }, buttons),
      result,
      h(
        "dl",
        { class: "facts" },
        field(t("letters.reason"), h("span", { class: "message", "data-testid": "letter-reason" }, letter.reason)),
        field(t("letters.kind"), t(`kind.${letter.kind}`)),
        field(t("letters.received"), format.dateTime(letter.received_at)),
        field(t("letters.service"), letter.service || "–"),
        field(t("letters.queue"), letter.queue || "–"),
        field(t("letters.event_type"), `${letter.event_type || "–"}${letter.schema_version ? ` v${letter.schema_version}` : ""}`),
        field(t("letters.event_id"), letter.event_id || "–"),
        field(t("letters.pipeline"), pipelineLink(letter.pipeline_id)),
        field(t("letters.replays"), format.number(letter.replays)),
      ),
      h("h2", {}, t("letters.body"), " ", h("small", {}, `${letter.body_encoding} · ${format.bytes(letter.body_size)}${letter.body_truncated ? ` · ${t("letters.truncated")}` : ""}`)),
      h("pre", { class: "body", "data-testid": "letter-body" }, letter.body),
      h("h2", {}, t("letters.headers")),
      h("pre", { class: "body" }, JSON.stringify(letter.headers, null, 2)),
      h("h2", {}, t("letters.actions")),
      letter.actions.length
        ? h("ul", { "data-testid": "letter-actions" }, letter.actions.map((a) => h("li", {}, `${format.dateTime(a.at)} · ${a.action} · ${a.actor}${a.key_name ? ` (${a.key_name})` : ""} · ${a.detail}`)))
        : h("p", {}, t("letters.no_actions")),
    );
  }

  async function read() {
    try {
      draw(await call(`/v1/dead-letters/${id}`));
    } catch (error) {
      fill(content, result);
      result.textContent = problem(error);
    }
  }

  async function act(path, body, done) {
    let text;
    try {
      text = done(await call(`/v1/dead-letters/${id}/${path}`, { method: "POST", body }));
    } catch (error) {
      text = problem(error);
    }
    await read();
    result.textContent = text;
  }

  async function replay(letter) {
    const answer = await confirmAction({
      title: t("letters.replay_title", { id: letter.id }),
      message: t("letters.replay_message", { queue: letter.queue || "–" }),
      confirmLabel: t("letters.replay"),
    });
    if (answer) await act("replay", undefined, (a) => a.detail);
  }

  async function discard(letter) {
    const answer = await confirmAction({
      title: t("letters.discard_title", { id: letter.id }),
      message: t("letters.discard_message"),
      confirmLabel: t("letters.discard"),
      reason: { label: t("action.reason"), placeholder: t("letters.discard_hint"), required: true },
      danger: true,
    });
    if (answer) await act("discard", { reason: answer.reason }, () => t("letters.discarded"));
  }

  root.append(h("p", {}, h("a", { href: "#/dead-letters" }, `← ${t("nav.dead_letters")}`)), content);
  read();
}
