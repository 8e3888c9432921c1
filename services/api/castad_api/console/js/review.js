// A pipeline's review: the lyrics' draft, which waits for a person before the song is paid for. A key with
// `submit` approves it, edits it in place, or asks for a new one (with a note); any other key sees it read-only.
// Kept live from the pipeline's event stream, with the time left counted down.

import { ApiError, call, problem } from "./api.js";
import { confirmAction } from "./dialog.js";
import { definition as field, fill, h } from "./dom.js";
import * as format from "./format.js";
import { t, tOr } from "./i18n.js";
import { AWAITING_REVIEW, badge, isEnded } from "./model.js";
import { follow } from "./sse.js";

const TICK_MS = 1000;
const MAX_LYRICS_CHARS = 8000; // the gateway's limit on an edit (its 422 says which other limit an edit breaks)
const MAX_NOTE_CHARS = 500;

/** Whether the draft still waits for a decision. */
function isOpen(draft) {
  return draft.decision === null && draft.expired_at === null;
}

/** Who decided: a key, the draft's timeout, or a notice's signed link (no key). */
function decider(draft) {
  if (draft.decided_by_key_id) return t("review.by_key", { key: draft.decided_by_key_id });
  return draft.expired_at ? t("review.by_timeout") : t("review.by_link");
}

export function render(root, { arg: id, may }) {
  let view = null; // the pipeline, its review with it
  let drawn = null; // what the review part was drawn for: a live refresh redraws it only when that changes
  let editor = null; // the editable draft's fields, while it waits and the key may decide
  let streamState = "connecting"; // the event stream's, as sse.follow tells it
  let refreshing = null;
  let again = false;

  const live = h("span", { class: "live", "data-testid": "live", "data-state": "connecting" }, t("live.connecting"));
  const head = h("section", { class: "pipeline-head" });
  const left = h("span", { class: "left", "data-testid": "review-left" });
  const facts = h("dl", { class: "facts", "data-testid": "review-facts" });
  const body = h("section", { class: "panel review", "data-testid": "review" });
  const result = h("p", { class: "notice", role: "status", "data-testid": "review-result" });
  const refused = h("p", { class: "problem", role: "alert", "data-testid": "review-error" });

  function drawHead() {
    fill(
      head,
      h("div", { class: "title" }, h("h1", {}, t("review.title", { customer: view.brief.customer_name })), badge(view.status, "pipeline-status"), live),
      h("p", { class: "brief" }, h("a", { href: `#/pipelines/${id}`, "data-testid": "back-to-pipeline" }, t("review.back"))),
      facts,
    );
  }

  function drawFacts() {
    const draft = view.review.draft;
    if (!draft) {
      const asked = view.review.asked;
      fill(facts, field(t("review.asked"), t("review.asked_for", { time: format.span(asked.timeout_s) }), " · ", t(`review.then.${asked.on_timeout}`)));
      return;
    }
    fill(
      facts,
      field(t("review.round"), h("span", { "data-testid": "review-round" }, t("review.round_n", { n: draft.round + 1 }))),
      field(t("review.regenerations_left"), h("span", { "data-testid": "review-regenerations-left" }, format.number(draft.regenerations_left))),
      field(t("review.drafted"), format.dateTime(draft.drafted_at)),
      field(t("review.until"), format.dateTime(draft.review_until), isOpen(draft) ? [" · ", left] : null),
      field(t("review.after"), h("span", { "data-testid": "review-on-timeout", "data-on-timeout": draft.on_timeout }, t(`review.then.${draft.on_timeout}`))),
      draft.decision && field(t("review.decision"), h("span", { "data-testid": "review-decision", "data-decision": draft.decision }, t(`review.decision.${draft.decision}`))),
      draft.decided_at && field(t("review.decided_at"), `${format.dateTime(draft.decided_at)} · ${decider(draft)}`),
      draft.note && field(t("review.note"), h("span", { "data-testid": "review-note-sent" }, draft.note)),
    );
    tick();
  }

  /** The time left before the draft comes to its timeout, counted down every second. */
  function tick() {
    const draft = view?.review?.draft;
    if (!draft || !isOpen(draft)) return;
    const seconds = (Date.parse(draft.review_until) - Date.now()) / 1000;
    left.textContent = seconds > 0 ? t("review.left", { time: format.span(seconds) }) : t("review.due");
  }

  /** What the review part shows, in one word: redrawn when it changes, so a refresh keeps what is being typed. */
  function state() {
    const draft = view.review.draft;
    if (!draft) return "none";
    if (!isOpen(draft)) return `${draft.id}:decided`;
    if (view.status !== AWAITING_REVIEW) return `${draft.id}:not-waiting:${view.status}`;
    return may("submit") ? `${draft.id}:open` : `${draft.id}:read-only`;
  }

  function drawBody() {
    const now = state();
    if (now === drawn) {
      if (editor) editor.update();
      return;
    }
    drawn = now;
    editor = null;
    const draft = view.review.draft;
    if (!draft) {
      fill(body, h("p", { class: "note", "data-testid": "review-no-draft" }, isEnded(view.status) ? t("review.ended_undrafted") : t("review.no_draft")));
    } else if (!isOpen(draft)) {
      fill(body, decided(draft));
    } else if (now.endsWith(":open")) {
      editor = edit(draft);
      fill(body, editor.shown);
    } else {
      const why = view.status === AWAITING_REVIEW ? t("review.read_only") : t("review.not_waiting", { status: t(`status.${view.status}`) });
      fill(body, h("h2", {}, t("review.draft")), lyrics(draft.text, "review-draft-text"), h("p", { class: "note", "data-testid": "review-read-only" }, why));
    }
  }

  function lyrics(text, testid) {
    return h("pre", { class: "lyrics", "data-testid": testid }, text);
  }

  /** A decided draft, read-only: what was decided, and the lyrics the song is made of. */
  function decided(draft) {
    const shown = [h("p", { class: "decided", "data-testid": "review-decided", "data-decision": draft.decision }, t(`review.decided.${draft.decision}`))];
    if (draft.decision === "edit") {
      shown.push(
        h("h2", {}, t("review.edited_text")),
        lyrics(draft.edited_text, "review-edited"),
        h("details", {}, h("summary", {}, t("review.as_drafted")), lyrics(draft.text, "review-draft-text")),
      );
    } else {
      shown.push(h("h2", {}, t("review.draft")), lyrics(draft.text, "review-draft-text"));
    }
    if (draft.decision === "regenerate" && !isEnded(view.status)) shown.push(h("p", { class: "note" }, t("review.redrafting")));
    return shown;
  }

  /** The draft in an editable textarea, with Approve, Save edit, and Regenerate with its note. */
  function edit(draft) {
    const text = h("textarea", { rows: Math.min(Math.max(draft.text.split("\n").length + 1, 8), 30), maxlength: MAX_LYRICS_CHARS, spellcheck: "false", "aria-label": t("review.draft"), "data-testid": "review-text" });
    text.value = draft.text;
    const note = h("input", { type: "text", maxlength: MAX_NOTE_CHARS, placeholder: t("review.note_hint"), "aria-label": t("review.note"), "data-testid": "review-note" });
    const approve = h("button", { type: "button", class: "primary", "data-testid": "review-approve" }, t("review.approve"));
    const save = h("button", { type: "button", "data-testid": "review-edit" }, t("review.save_edit"));
    const regenerate = h("button", { type: "button", "data-testid": "review-regenerate" }, t("review.regenerate"));
    const changed = h("span", { class: "note", "data-testid": "review-changed" });
    let sending = false;

    function update() {
      const edited = text.value !== draft.text;
      changed.textContent = edited ? t("review.unsaved") : "";
      approve.disabled = sending;
      save.disabled = sending || !edited || !text.value.trim();
      regenerate.disabled = sending || draft.regenerations_left < 1;
      regenerate.title = draft.regenerations_left < 1 ? t("review.no_regenerations") : "";
    }

    async function decide(decision, extra = {}) {
      sending = true;
      update();
      clearRefusal();
      result.textContent = "";
      for (const marked of [text, note]) marked.removeAttribute("aria-invalid");
      try {
        await call(`/v1/pipelines/${id}/review`, { method: "POST", body: { draft: draft.id, decision, ...extra } });
        result.textContent = t(`review.done.${decision}`);
      } catch (error) {
        showRefusal(error, { lyrics: text, note });
      } finally {
        sending = false;
      }
      await refresh();
      update();
    }

    approve.addEventListener("click", async () => {
      if (text.value !== draft.text) {
        const sure = await confirmAction({ title: t("review.approve_title"), message: t("review.approve_message"), confirmLabel: t("review.approve") });
        if (!sure) return;
      }
      await decide("approve");
    });
    save.addEventListener("click", () => decide("edit", { lyrics: text.value }));
    regenerate.addEventListener("click", () => decide("regenerate", note.value.trim() ? { note: note.value.trim() } : {}));
    for (const typed of [text, note]) {
      typed.addEventListener("input", () => {
        typed.removeAttribute("aria-invalid");
        clearRefusal(); // said of what was sent, not of what is being typed
        update();
      });
    }
    update();
    return {
      update,
      shown: [
        h("h2", {}, t("review.draft")),
        h("p", { class: "hint" }, t("review.hint")),
        text,
        h("div", { class: "actions" }, approve, save, changed),
        h("div", { class: "actions regenerate" }, note, regenerate),
      ],
    };
  }

  function clearRefusal() {
    fill(refused);
    delete refused.dataset.status;
  }

  /** A refused decision, said plainly: a 422 names the field and why, a 409 why the draft cannot be decided. */
  function showRefusal(error, inputs) {
    if (!(error instanceof ApiError)) throw error;
    refused.dataset.status = String(error.status);
    if (error.status === 422 && error.fields.length) {
      fill(
        refused,
        error.fields.flatMap((f, i) => {
          const name = f.loc.filter((part) => part !== "body").join(".");
          inputs[name]?.setAttribute("aria-invalid", "true");
          const said = h("span", { class: "refusal", "data-field": name }, t("review.invalid", { field: tOr(`review.field.${name}`, name), reason: f.msg }));
          return i ? [" ", said] : [said];
        }),
      );
    } else if (error.status === 409) {
      fill(refused, t("review.conflict", { reason: error.message }));
    } else {
      fill(refused, problem(error));
    }
  }

  function showLive() {
    // The gateway closes an ended pipeline's stream: said so, not shown as a connection being lost.
    const shown = streamState === "reconnecting" && view && isEnded(view.status) ? "ended" : streamState;
    live.dataset.state = shown;
    live.textContent = t(`live.${shown}`);
  }

  async function refresh() {
    if (refreshing) {
      again = true;
      return refreshing;
    }
    refreshing = (async () => {
      try {
        view = await call(`/v1/pipelines/${id}`);
        drawHead();
        showLive();
        if (view.review) {
          drawFacts();
          drawBody();
        } else {
          fill(facts);
          fill(body, h("p", { class: "note", "data-testid": "review-none" }, t("review.none")));
        }
      } catch (error) {
        fill(refused, problem(error));
      }
    })();
    await refreshing;
    refreshing = null;
    if (again) {
      again = false;
      await refresh();
    }
  }

  root.append(head, h("div", { class: "review-messages" }, result, refused), body);
  const stream = follow(`/v1/pipelines/${id}/events`, {
    onEvent: () => refresh(),
    onState: (state) => {
      streamState = state;
      showLive();
    },
  });
  const timer = setInterval(tick, TICK_MS);
  refresh();
  return () => {
    stream.close();
    clearInterval(timer);
  };
}
