// The login: an API key (kept in sessionStorage for this tab only) and the name recorded with the
// operator's actions (the X-Castad-Actor header).

import { ApiError, problem as describe, session, whoIs } from "./api.js";
import { h } from "./dom.js";
import { t } from "./i18n.js";

export function render(root, { notice, signedIn }) {
  const key = h("input", { type: "password", autocomplete: "off", required: true, "data-testid": "login-key" });
  const actor = h("input", {
    type: "text",
    value: session.actor(),
    required: true,
    maxlength: 200,
    pattern: "[ -~]+", // printable ASCII: what the header takes
    "data-testid": "login-actor",
  });
  const problem = h("p", { class: "problem", role: "alert", "data-testid": "login-error" }, notice || "");
  const submit = h("button", { type: "submit", class: "primary", "data-testid": "login-submit" }, t("login.submit"));
  const form = h(
    "form",
    { class: "login panel", "data-testid": "login" },
    h("h1", {}, t("login.title")),
    h("p", {}, t("login.hint")),
    h("label", {}, t("login.key"), key),
    h("label", {}, t("login.actor"), actor, h("small", {}, t("login.actor_hint"))),
    problem,
    submit,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    problem.textContent = "";
    try {
      const caller = await whoIs(key.value.trim());
      session.start(key.value.trim(), actor.value.trim());
      signedIn(caller);
    } catch (error) {
      problem.textContent = error instanceof ApiError && error.status === 401 ? t("login.refused") : describe(error);
    } finally {
      submit.disabled = false;
    }
  });
  root.append(form);
  key.focus();
}
