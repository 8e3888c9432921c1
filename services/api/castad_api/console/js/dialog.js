// A confirmation before an operator's action, as a modal <dialog>: what will happen, optionally a reason.

import { h } from "./dom.js";
import { t } from "./i18n.js";

/**
 * Ask before acting. Resolves to null when the operator backs out, else to {reason} (the reason field's
 * text, when one was asked for). A required reason keeps the confirm button disabled while empty.
 */
export function confirmAction({ title, message, confirmLabel, reason = null, danger = false }) {
  return new Promise((resolve) => {
    const field = reason
      ? h("textarea", { rows: 2, maxlength: 500, "data-testid": "confirm-reason", placeholder: reason.placeholder || "" })
      : null;
    const confirm = h("button", { type: "button", class: danger ? "danger" : "primary", "data-testid": "confirm" }, confirmLabel);
    const back = h("button", { type: "button", "data-testid": "confirm-back" }, t("dialog.back"));
    const dialog = h(
      "dialog",
      { class: "confirm", "data-testid": "confirm-dialog" },
      h("h2", {}, title),
      h("p", {}, message),
      field && h("label", {}, reason.label, field),
      h("div", { class: "buttons" }, back, confirm),
    );
    let answer = null;
    const update = () => {
      confirm.disabled = Boolean(reason?.required) && !field.value.trim();
    };
    field?.addEventListener("input", update);
    update();
    confirm.addEventListener("click", () => {
      answer = { reason: field ? field.value.trim() : null };
      dialog.close();
    });
    back.addEventListener("click", () => dialog.close());
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(answer);
    });
    document.body.append(dialog);
    dialog.showModal();
    (field || back).focus();
  });
}
