// What the console knows of pipelines and stages, shared by its pages.

import { h } from "./dom.js";
import * as format from "./format.js";
import { t } from "./i18n.js";
import { ENDED } from "./vocabulary.js";

// The statuses and stages, as the gateway writes them from the contracts (castad_api.routes.console).
export { AWAITING_REVIEW, ENDED, IN_FLIGHT, STAGES, STATUSES } from "./vocabulary.js";

export function isEnded(status) {
  return ENDED.includes(status);
}

/** A status as a badge: its name in the page's language, its code in data-status (for styles and tests). */
export function badge(status, testid = null) {
  return h("span", { class: `badge status-${status}`, "data-status": status, "data-testid": testid }, t(`status.${status}`));
}

export function progressBar(percent) {
  return h("progress", { max: 100, value: percent, title: `${percent}%` });
}

/** A number with its label, in a group of counts; data-count names it (for tests). */
export function countCell(key, number, label) {
  return h("div", { class: "count", "data-count": key }, h("span", { class: "n" }, format.number(number)), h("span", { class: "label" }, label));
}
