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

const UNITS = [["day", 86400], ["hour", 3600], ["minute", 60], ["second", 1]];

function inUnit(n, unit) {
  return new Intl.NumberFormat(locale(), { style: "unit", unit, unitDisplay: "short" }).format(n);
}

/** A length of time as people say it, in its largest unit and the next one: "2 days 3 hr", "9 min 58 sec". */
export function span(totalSeconds) {
  const whole = Math.max(0, Math.floor(totalSeconds));
  const first = UNITS.findIndex(([, size]) => whole >= size);
  if (first === -1) return inUnit(0, "second");
  const [unit, size] = UNITS[first];
  const parts = [inUnit(Math.floor(whole / size), unit)];
  const next = UNITS[first + 1];
  if (next && whole % size >= next[1]) parts.push(inUnit(Math.floor((whole % size) / next[1]), next[0]));
  return parts.join(" ");
}

/** How long ago `value` (a time) was, as span() writes it. */
export function age(value) {
  return span((Date.now() - Date.parse(value)) / 1000);
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

/** A UTC day (YYYY-MM-DD) as the page's language writes it; `short`: its day and month only (a chart's axis). */
export function day(value, short = false) {
  if (!value) return "";
  const style = short ? { day: "numeric", month: "short" } : { dateStyle: "medium" };
  return new Intl.DateTimeFormat(locale(), { ...style, timeZone: "UTC" }).format(new Date(`${value}T00:00:00Z`));
}

/** An amount in `currency`: as money when it is an ISO 4217 code Intl knows, else the number and the name. */
export function money(value, currency) {
  try {
    return new Intl.NumberFormat(locale(), { style: "currency", currency, maximumFractionDigits: 4 }).format(value);
  } catch {
    return `${number(value, 4)} ${currency}`;
  }
}
