// Building the page from data without ever parsing data as HTML: every text goes in as a text node,
// every attribute through setAttribute, and links only to places the console trusts.

const SVG_NS = "http://www.w3.org/2000/svg";

function setAttributes(element, attributes) {
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(element.dataset, value);
    } else if (name === "href" && !isSafeHref(String(value))) {
      throw new Error(`refused link: ${value}`);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

/** A link the console itself makes (a route, an object URL) or to an http(s) address, never javascript:. */
export function isSafeHref(href) {
  return href.startsWith("#") || href.startsWith("blob:") || /^https?:\/\//i.test(href);
}

/** Children appended as nodes; strings and numbers become text nodes; null, undefined and false are left out. */
export function append(parent, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** An HTML element: h("a", {href: "#/board"}, "Board"). */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  setAttributes(element, attributes);
  return append(element, children);
}

/** An SVG element, for the charts. */
export function svg(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG_NS, tag);
  setAttributes(element, attributes);
  return append(element, children);
}

/** Replace everything in `parent` with `children`. */
export function fill(parent, ...children) {
  parent.replaceChildren();
  return append(parent, children);
}

/** A term and its description, for a <dl>: [<dt>, <dd>]. */
export function definition(term, ...description) {
  return [h("dt", {}, term), h("dd", {}, ...description)];
}
