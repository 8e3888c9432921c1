// Server-Sent Events read with fetch, so that the request carries the API key (EventSource cannot send a
// header): `id:`, `event:` and `data:` lines, comments skipped; after a drop or the server closing the
// stream, it reconnects with Last-Event-ID, backing off while nothing comes.

import { authorization, unauthorized, url } from "./api.js";

const FIRST_DELAY_MS = 500;
const MAX_DELAY_MS = 10000;

/** A parser fed chunks of text as they arrive; calls `dispatch({id, event, data})` per complete event. */
export class EventParser {
  constructor(dispatch) {
    this.dispatch = dispatch;
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.id = undefined;
    this.event = "message";
    this.data = [];
  }

  feed(chunk) {
    this.buffer += chunk;
    for (;;) {
      const ending = /\r\n|\r|\n/.exec(this.buffer);
      if (!ending) return;
      // A \r at the very end may be the first half of a \r\n still on its way.
      if (ending[0] === "\r" && ending.index === this.buffer.length - 1) return;
      this.line(this.buffer.slice(0, ending.index));
      this.buffer = this.buffer.slice(ending.index + ending[0].length);
    }
  }

  line(line) {
    if (line === "") {
      if (this.data.length) this.dispatch({ id: this.id, event: this.event, data: this.data.join("\n") });
      this.reset();
      return;
    }
    if (line.startsWith(":")) return; // a keep-alive comment
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") this.id = value;
    else if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
  }
}

/**
 * Follow an event stream of the gateway: `onEvent({id, event, data})` for each event, `onState("open" |
 * "reconnecting" | "refused")` as the connection goes. Returns {close, restart}: restart reconnects at once (after an
 * action that makes a closed stream go on, a pipeline's retry).
 */
export function follow(path, { params = {}, onEvent, onState = () => {} }) {
  let lastEventId = null;
  let closed = false;
  let controller = null;
  let timer = null;
  let delay = FIRST_DELAY_MS;
  let generation = 0; // a connection that was replaced (restart, close) stops without reconnecting

  async function connect() {
    const mine = ++generation;
    timer = null;
    controller = new AbortController();
    let received = false;
    try {
      const headers = { ...authorization(), Accept: "text/event-stream" };
      if (lastEventId !== null) headers["Last-Event-ID"] = lastEventId;
      const response = await fetch(url(path, params), { headers, signal: controller.signal, cache: "no-store" });
      if (response.status === 401) {
        closed = true;
        unauthorized();
        return;
      }
      if (response.status >= 400 && response.status < 500) {
        closed = true; // refused for good (not found, a bad filter): asking again changes nothing
        onState("refused");
        return;
      }
      if (response.ok) {
        onState("open");
        const parser = new EventParser((event) => {
          received = true;
          if (event.id !== undefined) lastEventId = event.id;
          onEvent(event);
        });
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser.feed(value);
        }
      }
    } catch (error) {
      if (closed || mine !== generation) return; // aborted on purpose: nothing to report
      // A network error (TypeError) is a drop, reconnected below; anything else is a bug.
      if (error.name !== "TypeError") throw error;
    }
    if (closed || mine !== generation) return;
    onState("reconnecting");
    delay = received ? FIRST_DELAY_MS : Math.min(delay * 2, MAX_DELAY_MS);
    timer = setTimeout(connect, delay);
  }

  connect();
  return {
    close() {
      closed = true;
      generation += 1;
      clearTimeout(timer);
      controller?.abort();
    },
    restart() {
      if (closed) return;
      clearTimeout(timer);
      const previous = controller;
      delay = FIRST_DELAY_MS;
      connect(); // a new generation (before its first await), so the aborted one ends without reconnecting
      previous?.abort();
    },
  };
}
