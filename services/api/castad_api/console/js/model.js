// What the console knows of pipelines and stages, shared by its pages.

import { h } from "./dom.js";
import * as format from "./format.js";
import { t } from "./i18n.js";

export const STATUSES = ["PENDING", "RUNNING", "AWAITING_REVIEW", "CANCELING", "SUCCEEDED", "FAILED", "CANCELED"];
export const IN_FLIGHT = ["PENDING", "RUNNING", "AWAITING_REVIEW", "CANCELING"];
export const AWAITING_REVIEW = "AWAITING_REVIEW"; // a draft waits for a person's decision
export const ENDED = ["SUCCEEDED", "FAILED", "CANCELED"];
export const STAGES = ["lyric", "song", "video"];

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
