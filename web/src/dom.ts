/* A small element builder: h("td", {class: "num"}, "42"). Attributes are set with
 * setAttribute (true sets an empty attribute, false/null/undefined leave it out); children
 * are nodes or text, never HTML. */

export type Child = Node | string | number | null | undefined | false;
export type Attrs = Record<string, string | number | boolean | null | undefined>;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs?: Attrs | null,
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === false || v === null || v === undefined) continue;
    el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

export function append(el: Element, children: (Child | Child[])[]): void {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === "number" ? String(c) : c);
  }
}

/** Replaces every child of el. */
export function replace(el: Element, ...children: (Child | Child[])[]): void {
  el.replaceChildren();
  append(el, children);
}

/** A table with a caption (read by screen readers), column headers and a body to fill. */
export function table(
  id: string | null,
  caption: string,
  headers: { label: string; num?: boolean; title?: string }[],
): { table: HTMLTableElement; body: HTMLTableSectionElement } {
  const body = h("tbody");
  const t = h(
    "table",
    { id, class: "grid" },
    h("caption", { class: "sr-only" }, caption),
    h("thead", null, h("tr", null, headers.map((c) => h("th", { scope: "col", class: c.num ? "num" : null, title: c.title }, c.label)))),
    body,
  );
  return { table: t, body };
}

/** A link to the REST answer a panel shows (relative, as every URL of the page). */
export function source(path: string): HTMLAnchorElement {
  return h("a", { class: "src", href: path, target: "_blank", rel: "noopener", title: `GET ${path}` }, path);
}
