// h builds an element: h("td", {class: "num"}, "12"). Text is always text
// (never parsed as HTML), so names from the API cannot inject markup.
export function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c != null && c !== false) e.append(c instanceof Node ? c : String(c));
  return e;
}

// table is a table with a caption for screen readers; rows are arrays of
// cells (a cell: text, a Node, or {v, num}); at phone width each row is a
// card whose lines are labelled by the column names.
export function table(id, caption, columns, rows, empty) {
  if (!rows.length) return h("p", {id, dataset: {rows: "0"}}, empty);
  const head = h("tr", null, columns.map((c) => h("th", {scope: "col", class: c.num ? "num" : null}, c.name || c)));
  const body = rows.map((r) => h("tr", null, r.map((cell, i) => {
    const col = columns[i];
    return h("td", {class: col.num ? "num" : null, "data-label": col.name || col}, cell);
  })));
  return h("div", {class: "table"}, h("table", {id, class: "cards", dataset: {rows: String(rows.length)}},
    h("caption", {class: "skip"}, caption), h("thead", null, head), h("tbody", null, body)));
}

export function ago(iso) {
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  return s < 1 ? "now" : s < 90 ? `${Math.round(s)} s ago` : `${Math.round(s / 60)} min ago`;
}

export function when(unix) {
  return unix ? new Date(unix * 1000).toLocaleString() : "–";
}

export function field(label, input) {
  const id = input.id || ("f-" + Math.random().toString(36).slice(2));
  input.id = id;
  return h("div", null, h("label", {for: id}, label), input);
}
