// How numbers, times, sizes and durations read, in the language of the page.

import { locale } from "./i18n.js";

export function dateTime(value) {
  if (!value) return "";
  return new Intl.DateTimeFormat(locale(), { dateStyle: "short", timeStyle: "medium" }).format(new Date(value));
}

export function time(value) {
  if (!value) return "";
  return new Intl.DateTimeFormat(locale(), { timeStyle: "medium" }).format(new Date(value));
}

export function number(value, digits = 0) {
  return new Intl.NumberFormat(locale(), { maximumFractionDigits: digits }).format(value);
}

export function percent(rate) {
  if (rate === null || rate === undefined) return "–";
  return new Intl.NumberFormat(locale(), { style: "percent", maximumFractionDigits: 1 }).format(rate);
}

export function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${number(value * 1000)} ms`;
  if (value < 120) return `${number(value, 1)} s`;
  if (value < 7200) return `${number(value / 60, 1)} min`;
  return `${number(value / 3600, 1)} h`;
}

export function bytes(size) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = size;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${number(value, unit ? 1 : 0)} ${units[unit]}`;
}

/** The first characters of an id: enough to tell pipelines apart on a board. */
export function shortId(id) {
  return String(id).slice(0, 8);
}
