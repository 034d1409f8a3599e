// A small SVG line chart: series of numbers (null: a gap) over the same
// time axis. Hand-written rather than a charting library: a few lines, no
// dependency to vendor and keep up to date.
const NS = "http://www.w3.org/2000/svg";

function el(name, attrs) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

// niceMax rounds max up to 1, 2 or 5 times a power of ten.
function niceMax(max) {
  if (!(max > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(max));
  for (const m of [1, 2, 5, 10]) if (m * p >= max) return m * p;
  return 10 * p;
}

// draw replaces svg's content with series (arrays of equal length, the last
// value the newest) drawn over capacity points; unit labels the y axis.
export function draw(svg, series, capacity, unit) {
  const W = 300, H = 100, left = 34, bottom = 12;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.replaceChildren();
  let max = 0;
  for (const s of series) for (const v of s) if (v != null && v > max) max = v;
  max = niceMax(max);
  const x = (i, n) => left + (W - left) * (capacity - n + i) / Math.max(1, capacity - 1);
  const y = (v) => (H - bottom) - (H - bottom - 4) * v / max;
  for (const f of [0, 0.5, 1]) {
    svg.append(el("line", {class: "grid", x1: left, x2: W, y1: y(max * f), y2: y(max * f)}));
    const t = el("text", {x: 2, y: y(max * f) + 3});
    t.textContent = fmt(max * f) + (f === 1 ? " " + unit : "");
    svg.append(t);
  }
  const t = el("text", {x: left, y: H - 1});
  t.textContent = `last ${capacity} s`;
  svg.append(t);
  series.forEach((s, k) => {
    let d = "", pen = false;
    s.forEach((v, i) => {
      if (v == null) { pen = false; return; }
      d += (pen ? "L" : "M") + x(i, s.length).toFixed(1) + " " + y(v).toFixed(1);
      pen = true;
    });
    svg.append(el("path", {class: "s" + k, d, "vector-effect": "non-scaling-stroke"}));
  });
}

export function fmt(v) {
  if (v == null) return "–";
  if (v >= 100) return Math.round(v).toString();
  if (v >= 10) return v.toFixed(1);
  return v.toFixed(2).replace(/\.?0+$/, "") || "0";
}
