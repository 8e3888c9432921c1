// One pipeline: its brief and state, its photos, a card per stage, previews of what the stages made (lyrics, the song,
// the video), its attempts and timeline, links to its files and its trace, the way to its review when the brief asked
// for one, and the operator's Cancel and Retry; all kept live from the pipeline's own event stream.

import { call, download, problem } from "./api.js";
import { confirmAction } from "./dialog.js";
import { definition as field, fill, h } from "./dom.js";
import * as format from "./format.js";
import { t, tOr } from "./i18n.js";
import { AWAITING_REVIEW, badge, isEnded, progressBar } from "./model.js";
import { follow } from "./sse.js";
import { CANCELABLE, RETRYABLE } from "./vocabulary.js";

const EXTENSIONS = { "audio/wav": ".wav", "video/mp4": ".mp4", "text/plain": ".txt", "image/jpeg": ".jpg", "application/x-subrip": ".srt", "text/vtt": ".vtt" };

function extension(mediaType) {
  return EXTENSIONS[mediaType.split(";")[0].trim()] || "";
}

function errorText(code, message) {
  if (!code && !message) return null;
  return h("span", { class: "error" }, h("code", {}, code || ""), message ? ` ${message}` : "");
}

export function render(root, { arg: id, may }) {
  const urls = []; // object URLs made here, revoked when the page closes
  const previewed = new Map(); // stage -> sha256 of the file its preview shows
  let view = null;
  let streamState = "connecting"; // the event stream's, as sse.follow tells it
  let timeline = null;
  let refreshing = null;
  let again = false;

  const live = h("span", { class: "live", "data-testid": "live", "data-state": "connecting" }, t("live.connecting"));
  const head = h("section", { class: "pipeline-head" });
  const actions = h("div", { class: "actions" });
  const cancelButton = h("button", { type: "button", class: "danger", "data-testid": "cancel", onclick: () => cancel() }, t("action.cancel"));
  const retryButton = h("button", { type: "button", class: "primary", "data-testid": "retry", onclick: () => retry() }, t("action.retry"));
  const result = h("p", { class: "notice", role: "status", "data-testid": "action-result" });
  const review = h("section", { class: "review-call", "data-testid": "review-call", hidden: true });
  const stages = h("section", { class: "stages", "data-testid": "stages" });
  const photos = h("ul", { class: "photos", "data-testid": "photos" });
  let photosShown = false; // a brief never changes: its photos are fetched once
  const previews = {
    lyric: h("div", { class: "preview", "data-preview": "lyric" }),
    song: h("div", { class: "preview", "data-preview": "song" }),
    video: h("div", { class: "preview", "data-preview": "video" }),
  };
  const links = h("ul", { class: "links", "data-testid": "links" });
  const attempts = h("tbody", { "data-testid": "attempts" });
  const entries = h("tbody", { "data-testid": "timeline" });
  const more = h("p", { class: "more", hidden: true }, t("pipeline.timeline_more"));

  function objectUrl(blob) {
    const made = URL.createObjectURL(blob);
    urls.push(made);
    return made;
  }

  async function save(stage, artifact) {
    try {
      const link = h("a", { href: objectUrl(await download(artifact.download)), download: `${id}-${stage}${extension(artifact.media_type)}` });
      link.click();
    } catch (error) {
      result.textContent = problem(error);
    }
  }

  /** A player of a video, its poster shown before it plays once fetched (the video plays without it). */
  function player(blob, poster, shape) {
    const shown = h("video", { controls: true, preload: "metadata", src: objectUrl(blob), "data-testid": "video", "data-format": shape || "" });
    if (poster) download(poster.download).then((still) => shown.setAttribute("poster", objectUrl(still)), () => {});
    return shape ? h("figure", { class: "format" }, shown, h("figcaption", {}, shape)) : shown;
  }

  async function preview(stage, artifact, poster, formats = []) {
    if (previewed.get(stage) === artifact.sha256) return;
    previewed.set(stage, artifact.sha256);
    const box = previews[stage];
    fill(box, h("h3", {}, t(`stage.${stage}`)), h("p", { class: "loading" }, t("pipeline.loading")));
    try {
      let shown;
      if (stage === "lyric") shown = h("pre", { class: "lyrics", "data-testid": "lyrics" }, await (await download(artifact.download)).text());
      else if (stage === "song") shown = h("audio", { controls: true, preload: "metadata", src: objectUrl(await download(artifact.download)), "data-testid": "song" });
      else if (formats.length > 1) {
        const videos = await Promise.all(formats.map((f) => download(f.video.download)));
        shown = h("div", { class: "formats" }, formats.map((f, i) => player(videos[i], f.poster, f.format)));
      } else shown = player(await download(artifact.download), poster);
      fill(box, h("h3", {}, t(`stage.${stage}`)), shown);
    } catch (error) {
      previewed.delete(stage);
      fill(box, h("h3", {}, t(`stage.${stage}`)), h("p", { class: "problem" }, problem(error)));
    }
  }

  function drawHead() {
    const brief = view.brief;
    fill(
      head,
      h("div", { class: "title" }, h("h1", { "data-testid": "customer" }, brief.customer_name), badge(view.status, "pipeline-status"), live),
      h("p", { class: "brief" }, [brief.region, brief.detail_region_info].filter(Boolean).join(" · ")),
      progressBar(view.progress),
      h(
        "dl",
        { class: "facts" },
        field(t("pipeline.id"), h("code", {}, view.id)),
        field(t("pipeline.brief"), `${brief.language} · ${brief.genre} · ${(brief.formats || []).join(", ") || brief.orientation} · ${brief.duration_s} s`),
        field(t("pipeline.created"), format.dateTime(view.created_at)),
        field(t("pipeline.updated"), format.dateTime(view.updated_at)),
        view.finished_at && field(t("pipeline.finished"), format.dateTime(view.finished_at)),
        !isEnded(view.status) && view.deadline_at && field(t("pipeline.deadline"), format.dateTime(view.deadline_at)),
        view.retries > 0 && field(t("pipeline.retries"), format.number(view.retries)),
        view.cancel_reason && field(t("pipeline.cancel_reason"), view.cancel_reason),
        (view.error_code || view.error_message) && field(t("pipeline.error"), errorText(view.error_code, view.error_message)),
      ),
    );
    // The same buttons from one live refresh to the next, put back only when they change: a button replaced under
    // the pointer as an event arrives would take the operator's click with it.
    const buttons = [];
    if (may("operate") && CANCELABLE.includes(view.status)) buttons.push(cancelButton);
    if (may("operate") && RETRYABLE.includes(view.status)) buttons.push(retryButton);
    const shown = [...actions.children];
    if (buttons.length !== shown.length || buttons.some((button, i) => button !== shown[i])) fill(actions, buttons);
  }

  /** The brief's photos as thumbnails: an upload fetched with the session's key (the gateway serves a tenant's
   * images to its own keys only), a photo by URL as its link (the console loads nothing from elsewhere). */
  function drawPhotos() {
    if (photosShown) return;
    photosShown = true;
    const named = view.brief.photos || [];
    if (named.length === 0) {
      fill(photos, h("li", { class: "none" }, t("pipeline.no_photos")));
      return;
    }
    fill(
      photos,
      named.map((photo, i) => {
        const label = t("pipeline.photo", { n: i + 1 });
        if (photo.url) {
          return h("li", { class: "photo-link", "data-photo": i + 1 }, h("a", { href: photo.url, target: "_blank", rel: "noopener noreferrer", title: photo.url }, label));
        }
        const item = h("li", { "data-photo": i + 1 }, h("span", { class: "loading" }, t("pipeline.loading")));
        showPhoto(item, photo, label);
        return item;
      }),
    );
  }

  async function showPhoto(item, photo, label) {
    try {
      const blob = await download(`/v1/images/${encodeURIComponent(photo.id)}/content`);
      fill(item, h("img", { src: objectUrl(blob), alt: label, title: label, "data-testid": "photo", "data-image-id": photo.id }));
    } catch (error) {
      fill(item, h("span", { class: "problem", title: problem(error) }, label));
    }
  }

  function drawStages() {
    fill(
      stages,
      view.stages.map((s) =>
        h(
          "article",
          { class: "stage-card", "data-stage": s.stage, "data-status": s.status },
          h("h3", {}, t(`stage.${s.stage}`), " ", badge(s.status)),
          h(
            "dl",
            {},
            field(t("pipeline.attempts"), s.max_attempts ? `${s.attempts} / ${s.max_attempts}` : String(s.attempts)),
            s.started_at && field(t("pipeline.started"), format.time(s.started_at)),
            s.finished_at && field(t("pipeline.finished"), format.time(s.finished_at)),
            s.next_attempt_at && field(t("pipeline.next_attempt"), format.time(s.next_attempt_at)),
            (s.last_error_code || s.last_error_message) && field(t("pipeline.error"), errorText(s.last_error_code, s.last_error_message)),
            s.artifact && field(t("pipeline.file"), `${s.artifact.media_type.split(";")[0]} · ${format.bytes(s.artifact.size)}`),
          ),
        ),
      ),
    );
    for (const s of view.stages) {
      if (s.artifact) preview(s.stage, s.artifact, s.poster, s.formats || []);
    }
  }

  /** Where the brief's review stands, and the way to its page: called out while a draft waits for a decision. */
  function drawReview() {
    const draft = view.review?.draft;
    review.hidden = !view.review;
    if (!view.review) return;
    const waiting = view.status === AWAITING_REVIEW && draft && draft.decision === null;
    review.classList.toggle("waiting", Boolean(waiting));
    let said;
    if (waiting) said = t("review.call_waiting", { time: format.dateTime(draft.review_until), then: t(`review.then.${draft.on_timeout}`) });
    else if (draft?.decision) said = t("review.call_decided", { decision: t(`review.decision.${draft.decision}`) });
    else said = t("review.call_asked");
    fill(review, h("span", {}, said), " ", h("a", { href: `#/pipelines/${id}/review`, "data-testid": "open-review" }, waiting ? t("review.open") : t("review.see")));
  }

  function drawLinks() {
    const files = view.stages
      .filter((s) => s.artifact)
      .map((s) =>
        h(
          "li",
          {},
          h("button", { type: "button", class: "link", "data-download": s.stage, onclick: () => save(s.stage, s.artifact) }, t("pipeline.download", { stage: t(`stage.${s.stage}`) })),
          h("code", {}, s.artifact.download),
        ),
      );
    const posters = view.stages
      .filter((s) => s.poster)
      .map((s) =>
        h(
          "li",
          {},
          h("button", { type: "button", class: "link", "data-download": "poster", onclick: () => save("poster", s.poster) }, t("pipeline.poster")),
          h("code", {}, s.poster.download),
        ),
      );
    // With more than one format, each format's video and poster, the first (the stage's own file) included.
    const formats = view.stages
      .flatMap((s) => ((s.formats || []).length > 1 ? s.formats : []))
      .flatMap((f) => [
        h(
          "li",
          {},
          h("button", { type: "button", class: "link", "data-download": `format.${f.format}`, onclick: () => save(`video-${f.format.replace(":", "x")}`, f.video) }, t("pipeline.format", { format: f.format })),
          h("code", {}, f.video.download),
        ),
        f.poster &&
          h(
            "li",
            {},
            h("button", { type: "button", class: "link", "data-download": `format.${f.format}.poster`, onclick: () => save(`poster-${f.format.replace(":", "x")}`, f.poster) }, t("pipeline.format_poster", { format: f.format })),
            h("code", {}, f.poster.download),
          ),
      ]);
    const captions = view.stages
      .flatMap((s) => s.captions || [])
      .map((c) =>
        h(
          "li",
          {},
          h("button", { type: "button", class: "link", "data-download": `captions.${c.format}`, onclick: () => save("song", c) }, t("pipeline.captions", { format: c.format.toUpperCase() })),
          h("code", {}, c.download),
        ),
      );
    const trace = timeline.trace_url
      ? h("li", {}, h("a", { href: timeline.trace_url, target: "_blank", rel: "noopener noreferrer", "data-testid": "trace" }, t("pipeline.trace")), h("code", {}, timeline.trace_id))
      : timeline.trace_id && h("li", {}, t("pipeline.trace_id"), " ", h("code", {}, timeline.trace_id));
    fill(links, files, posters, formats, captions, trace);
  }

  function drawAttempts() {
    fill(
      attempts,
      timeline.attempts.map((a) =>
        h(
          "tr",
          { "data-stage": a.stage, "data-outcome": a.outcome },
          h("td", {}, t(`stage.${a.stage}`)),
          h("td", {}, String(a.attempt)),
          h("td", {}, a.worker || "–"),
          h("td", {}, format.time(a.started_at)),
          h("td", {}, format.seconds(a.duration_s)),
          h("td", {}, h("span", { class: `outcome outcome-${a.outcome}` }, t(`outcome.${a.outcome}`))),
          h("td", {}, a.error_code ? h("code", {}, a.error_code) : ""),
          h("td", { class: "message" }, a.error_message || ""),
        ),
      ),
    );
  }

  function entryDetail(entry) {
    const parts = [];
    if (entry.error) parts.push(errorText(entry.error.code, entry.error.message));
    if (entry.actor) parts.push(t("pipeline.by", { actor: entry.actor_key_name ? `${entry.actor} (${entry.actor_key_name})` : entry.actor }));
    if (entry.reason) parts.push(entry.reason);
    if (entry.resume) parts.push(t("pipeline.resumes_at", { stage: t(`stage.${entry.resume}`) }));
    if (entry.detail) parts.push(entry.detail);
    if (entry.draft?.decision) parts.push(t(`review.decision.${entry.draft.decision}`));
    if (entry.draft?.note) parts.push(entry.draft.note);
    if (entry.draft?.review_until) parts.push(t("review.waits_until", { time: format.dateTime(entry.draft.review_until) }));
    if (entry.next_attempt_at) parts.push(t("pipeline.next_at", { time: format.time(entry.next_attempt_at) }));
    return parts.flatMap((part, i) => (i ? [" · ", part] : [part]));
  }

  function drawTimeline() {
    fill(
      entries,
      timeline.entries.map((e) =>
        h(
          "tr",
          { "data-status": e.status },
          h("td", {}, format.time(e.time)),
          h("td", {}, e.step === "pipeline" ? t("pipeline.whole") : t(`stage.${e.step}`)),
          h("td", {}, tOr(`fact.${e.status}`, e.status)),
          h("td", {}, e.attempt ?? ""),
          h("td", {}, e.worker || ""),
          h("td", { class: "message" }, entryDetail(e)),
        ),
      ),
    );
    more.hidden = timeline.next_after === null;
  }

  function showLive() {
    // The gateway closes an ended pipeline's stream; it is asked again now and then, for a retry. The stream
    // may close before the refresh its last event asked for has shown the pipeline ended: both ask for this.
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
        [view, timeline] = await Promise.all([call(`/v1/pipelines/${id}`), call(`/v1/pipelines/${id}/timeline`)]);
        drawHead();
        drawReview();
        drawPhotos();
        drawStages();
        drawLinks();
        drawAttempts();
        drawTimeline();
        showLive();
      } catch (error) {
        result.textContent = problem(error);
      }
    })();
    await refreshing;
    refreshing = null;
    if (again) {
      again = false;
      await refresh();
    }
  }

  async function act(action, body, done) {
    try {
      const answer = await call(`/v1/pipelines/${id}/${action}`, { method: "POST", body });
      result.textContent = done(answer);
    } catch (error) {
      result.textContent = problem(error);
    }
    stream.restart(); // a retried pipeline's stream goes on, however long it had been closed
    await refresh();
  }

  async function cancel() {
    const answer = await confirmAction({
      title: t("action.cancel_title"),
      message: t("action.cancel_message", { customer: view.brief.customer_name }),
      confirmLabel: t("action.cancel"),
      reason: { label: t("action.reason"), placeholder: t("action.reason_hint") },
      danger: true,
    });
    if (answer) await act("cancel", answer.reason ? { reason: answer.reason } : {}, (a) => t("action.cancel_done", { status: t(`status.${a.status}`) }));
  }

  async function retry() {
    const answer = await confirmAction({
      title: t("action.retry_title"),
      message: t("action.retry_message", { customer: view.brief.customer_name }),
      confirmLabel: t("action.retry"),
    });
    if (answer) await act("retry", {}, (a) => t("action.retry_done", { stage: t(`stage.${a.resumes_at}`) }));
  }

  const headings = (keys) => h("thead", {}, h("tr", {}, keys.map((key) => h("th", {}, t(key)))));
  root.append(
    head,
    review,
    actions,
    result,
    h("section", { class: "photos-box" }, h("h2", {}, t("pipeline.photos")), photos),
    stages,
    h("section", { class: "previews" }, h("h2", {}, t("pipeline.previews")), previews.lyric, previews.song, previews.video),
    h("section", {}, h("h2", {}, t("pipeline.links")), links),
    h(
      "section",
      {},
      h("h2", {}, t("pipeline.attempts")),
      h("table", {}, headings(["pipeline.stage", "pipeline.number", "pipeline.worker", "pipeline.started", "pipeline.duration", "pipeline.outcome", "pipeline.code", "pipeline.message"]), attempts),
    ),
    h(
      "section",
      {},
      h("h2", {}, t("pipeline.timeline")),
      h("table", {}, headings(["pipeline.time", "pipeline.stage", "pipeline.what", "pipeline.number", "pipeline.worker", "pipeline.detail"]), entries),
      more,
    ),
  );

  const stream = follow(`/v1/pipelines/${id}/events`, {
    onEvent: () => refresh(),
    onState: (state) => {
      streamState = state;
      showLive();
    },
  });
  refresh();
  return () => {
    stream.close();
    for (const made of urls) URL.revokeObjectURL(made);
  };
}
