// The console's shell: hash routes, the session (who the key is, what it may do), the header with its
// navigation, the caller and the language switch. Each page renders into <main> and returns how to stop
// what it started (its event streams and timers) when the operator leaves it.

import * as api from "./api.js";
import * as board from "./board.js";
import * as brand from "./brand.js";
import * as deadLetters from "./dead_letters.js";
import { fill, h } from "./dom.js";
import { LANGUAGES, language, setLanguage, t } from "./i18n.js";
import * as login from "./login.js";
import * as pipeline from "./pipeline.js";
import * as review from "./review.js";
import * as stats from "./stats.js";
import * as usage from "./usage.js";

const ROUTES = [
  { pattern: /^board$/, render: board.render, title: "nav.board" },
  { pattern: /^pipelines\/([0-9a-f-]{36})$/, render: pipeline.render, title: "nav.pipeline" },
  { pattern: /^pipelines\/([0-9a-f-]{36})\/review$/, render: review.render, title: "nav.review" },
  { pattern: /^brand$/, render: brand.render, title: "nav.brand", scope: "read" },
  { pattern: /^usage$/, render: usage.render, title: "nav.usage", scope: "read" },
  { pattern: /^stats$/, render: stats.render, title: "nav.stats", scope: "admin" },
  { pattern: /^dead-letters$/, render: deadLetters.list, title: "nav.dead_letters", scope: "admin" },
  { pattern: /^dead-letters\/([0-9]+)$/, render: deadLetters.detail, title: "nav.dead_letters", scope: "admin" },
];

const header = document.querySelector("header.top");
const main = document.querySelector("main");
let caller = null;
let stop = null;
let notice = "";
let shown = 0; // the latest route: an earlier one still loading gives way

function may(scope) {
  return Boolean(caller) && (caller.scopes.includes("admin") || caller.scopes.includes(scope));
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function where() {
  const [path, query = ""] = location.hash.replace(/^#\/?/, "").split("?", 2);
  return { path, params: new URLSearchParams(query) };
}

function drawHeader(path) {
  const language_ = h(
    "select",
    { "aria-label": t("nav.language"), "data-testid": "language" },
    Object.entries(LANGUAGES).map(([code, name]) => h("option", { value: code, selected: code === language() }, name)),
  );
  language_.addEventListener("change", () => {
    setLanguage(language_.value);
    route();
  });
  const link = (hash, key, testid) => h("a", { href: hash, "data-testid": testid, class: path.startsWith(hash.slice(2)) ? "current" : null }, t(key));
  const nav = caller
    ? h(
        "nav",
        {},
        link("#/board", "nav.board", "nav-board"),
        may("read") && link("#/brand", "nav.brand", "nav-brand"),
        may("read") && link("#/usage", "nav.usage", "nav-usage"),
        may("admin") && link("#/stats", "nav.stats", "nav-stats"),
        may("admin") && link("#/dead-letters", "nav.dead_letters", "nav-dead-letters"),
      )
    : null;
  const who = caller
    ? h(
        "div",
        { class: "caller", "data-testid": "caller" },
        h("span", { class: "tenant", "data-testid": "tenant" }, caller.tenant),
        h("span", { class: "key-name" }, caller.name),
        h("span", { class: "scopes", "data-testid": "scopes" }, caller.scopes.map((s) => t(`scope.${s}`)).join(" · ")),
        h("button", { type: "button", class: "link", "data-testid": "logout", onclick: logout }, t("nav.logout")),
      )
    : null;
  fill(header, h("a", { href: "#/board", class: "brand" }, t("app.name")), nav, h("div", { class: "spacer" }), who, language_);
}

function logout() {
  api.session.end();
  caller = null;
  go("#/login");
}

async function route() {
  const mine = ++shown;
  stop?.();
  stop = null;
  const { path, params } = where();
  if (!api.session.key()) caller = null;
  if (api.session.key() && !caller) {
    try {
      caller = await api.whoIs(api.session.key());
    } catch (error) {
      if (mine !== shown) return;
      if (error.status !== 401) {
        fill(main, h("p", { class: "problem" }, api.problem(error)), h("button", { type: "button", onclick: route }, t("error.retry")));
        return;
      }
      api.session.end();
    }
    if (mine !== shown) return;
  }
  if (!caller && path !== "login") {
    go("#/login");
    return;
  }
  document.documentElement.lang = language();
  fill(main);
  drawHeader(path);
  if (path === "login") {
    document.title = `${t("login.title")} · ${t("app.name")}`;
    login.render(main, {
      notice,
      signedIn: (who) => {
        caller = who;
        notice = "";
        go("#/board");
      },
    });
    return;
  }
  const found = ROUTES.map((r) => ({ r, match: r.pattern.exec(path) })).find((f) => f.match);
  if (!found) {
    go("#/board");
    return;
  }
  document.title = `${t(found.r.title)} · ${t("app.name")}`;
  if (found.r.scope && !may(found.r.scope)) {
    main.append(h("p", { class: "problem", "data-testid": "not-allowed" }, t("error.scope", { scope: t(`scope.${found.r.scope}`) })));
    return;
  }
  stop = found.r.render(main, { params, arg: found.match[1], caller, may, go }) || null;
}

api.onUnauthorized(() => {
  caller = null;
  notice = t("login.ended");
  go("#/login");
});
window.addEventListener("hashchange", route);
route();
