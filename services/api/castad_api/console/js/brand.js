// The tenant's brand kit: its logo, colours, font and caption style, which every brief of the tenant uses from
// then on (a pipeline keeps the kit it began with). Shown to a key with `read`, edited by one with `submit`.

import { call, download, problem } from "./api.js";
import { fill, h, svg } from "./dom.js";
import * as format from "./format.js";
import { t } from "./i18n.js";

const FONTS = ["Nanum Gothic", "Nanum Myeongjo", "Nanum Square Round", "Noto Sans CJK", "Noto Serif CJK"];
const POSITIONS = ["middle", "bottom"];
const SIZES = ["small", "medium", "large"];
const DEFAULT_COLORS = ["#0b3d91", "#ffc20e"];

export function render(root, { may }) {
  const shown = h("section", { class: "panel brand-kit", "data-testid": "brand-kit" });
  const editor = h("section", { class: "panel brand-editor" });
  const result = h("p", { class: "action-result", role: "status", "data-testid": "brand-result" });
  fill(root, h("h1", {}, t("brand.title")), h("p", { class: "hint" }, t("brand.hint")), shown, editor, result);
  let kit = null;
  let gone = false;
  const urls = [];

  async function load() {
    try {
      kit = await call("/v1/brand");
    } catch (error) {
      if (gone) return;
      if (error.status !== 404) {
        // Not known: no editor, whose saving would replace a kit the page could not read.
        fill(shown, h("p", { class: "problem" }, problem(error)), h("button", { type: "button", onclick: load }, t("error.retry")));
        return;
      }
      kit = null;
    }
    if (gone) return;
    drawKit();
    if (may("submit")) drawEditor();
  }

  function drawKit() {
    if (!kit) {
      fill(shown, h("p", { class: "none", "data-testid": "no-brand" }, t("brand.none")));
      return;
    }
    const logo = h("span", { class: "logo" }, kit.logo ? t("pipeline.loading") : t("brand.no_logo"));
    if (kit.logo_download) {
      download(kit.logo_download).then(
        (blob) => {
          urls.push(URL.createObjectURL(blob));
          fill(logo, h("img", { src: urls[urls.length - 1], alt: t("brand.logo"), "data-testid": "brand-logo" }));
        },
        (error) => fill(logo, h("span", { class: "problem" }, problem(error))),
      );
    }
    fill(
      shown,
      h(
        "dl",
        { class: "facts" },
        h("dt", {}, t("brand.colors")),
        h("dd", { "data-testid": "brand-colors" }, kit.colors.map(swatch)),
        h("dt", {}, t("brand.logo")),
        h("dd", {}, logo),
        h("dt", {}, t("brand.font")),
        h("dd", { "data-testid": "brand-font" }, kit.font || t("brand.own_font")),
        h("dt", {}, t("brand.captions")),
        h("dd", { "data-testid": "brand-captions" }, `${t(`brand.position.${kit.caption_style.position}`)} · ${t(`brand.size.${kit.caption_style.size}`)}`),
        h("dt", {}, t("brand.updated")),
        h("dd", {}, format.dateTime(kit.updated_at)),
      ),
    );
  }

  function drawEditor() {
    const colors = kit ? kit.colors : DEFAULT_COLORS;
    const main = h("input", { type: "color", value: colors[0], "data-testid": "brand-main" });
    const accent = h("input", { type: "color", value: colors[colors.length - 1], "data-testid": "brand-accent" });
    const choice = (values, current, key, testid) =>
      h("select", { "data-testid": testid }, values.map((v) => h("option", { value: v, selected: v === current }, key ? t(`${key}.${v}`) : v)));
    const font = h(
      "select",
      { "data-testid": "brand-font-choice" },
      h("option", { value: "" }, t("brand.own_font")),
      FONTS.map((f) => h("option", { value: f, selected: kit?.font === f }, f)),
    );
    const position = choice(POSITIONS, kit?.caption_style.position || "middle", "brand.position", "brand-position");
    const size = choice(SIZES, kit?.caption_style.size || "medium", "brand.size", "brand-size");
    const file = h("input", { type: "file", accept: "image/jpeg,image/png,image/webp", "data-testid": "brand-logo-file" });
    const keep = h("input", { type: "checkbox", checked: Boolean(kit?.logo), disabled: !kit?.logo, "data-testid": "brand-keep-logo" });
    const save = h("button", { type: "submit", "data-testid": "brand-save" }, t("brand.save"));
    const remove = kit && h("button", { type: "button", class: "danger", "data-testid": "brand-remove", onclick: removeKit }, t("brand.remove"));
    const form = h(
      "form",
      { class: "brand-form" },
      h("label", {}, t("brand.main"), " ", main),
      h("label", {}, t("brand.accent"), " ", accent),
      h("label", {}, t("brand.font"), " ", font),
      h("label", {}, t("brand.caption_position"), " ", position),
      h("label", {}, t("brand.caption_size"), " ", size),
      h("label", {}, t("brand.new_logo"), " ", file),
      h("label", { class: "check" }, keep, " ", t("brand.keep_logo")),
      h("div", { class: "actions" }, save, remove),
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      save.disabled = true;
      result.textContent = "";
      try {
        let logo = keep.checked ? kit?.logo ?? null : null;
        if (file.files.length > 0) logo = (await call("/v1/images", { method: "POST", file: file.files[0] })).id;
        const colors = accent.value === main.value ? [main.value] : [main.value, accent.value]; // one: no accent of its own
        const body = { colors, font: font.value || null, logo, caption_style: { position: position.value, size: size.value } };
        kit = await call("/v1/brand", { method: "PUT", body });
        result.textContent = t("brand.saved");
        drawKit();
        drawEditor();
      } catch (error) {
        result.textContent = problem(error);
      } finally {
        save.disabled = false;
      }
    });
    fill(editor, h("h2", {}, kit ? t("brand.edit") : t("brand.set")), form);
  }

  async function removeKit() {
    result.textContent = "";
    try {
      await call("/v1/brand", { method: "DELETE" });
      kit = null;
      result.textContent = t("brand.removed");
      drawKit();
      drawEditor();
    } catch (error) {
      result.textContent = problem(error);
    }
  }

  load();
  return () => {
    gone = true;
    urls.forEach((made) => URL.revokeObjectURL(made));
  };
}

/** A colour as a small square of it (an SVG fill: the page's policy allows no inline style) and its value. */
function swatch(colour) {
  return h(
    "span",
    { class: "swatch", "data-color": colour },
    svg("svg", { width: 14, height: 14, viewBox: "0 0 14 14", "aria-hidden": "true" }, svg("rect", { width: 14, height: 14, fill: colour })),
    " ",
    colour,
  );
}
