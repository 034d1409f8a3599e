import {admin, events} from "../api.js";
import {h} from "../dom.js";
import {draw, fmt} from "../chart.js";

const CAPACITY = 300; // points kept: the last 5 minutes at one a second

// The charts: each a title, a unit and its series (a field of the event).
const charts = [
  {id: "tokens", title: "Tokens/s", unit: "tok/s", series: [["completion tokens/s", "tokens_per_s"], ["chunks/s", "chunks_per_s"]]},
  {id: "requests", title: "Requests/s", unit: "req/s", series: [["requests/s", "requests_per_s"]]},
  {id: "ttft", title: "Time to first token", unit: "ms", series: [["p50", "ttft_p50_ms"], ["p99", "ttft_p99_ms"]]},
  {id: "itl", title: "Inter-token latency", unit: "ms", series: [["p50", "itl_p50_ms"], ["p99", "itl_p99_ms"]]},
  {id: "queue", title: "Queue", unit: "req", series: [["waiting", "waiting"], ["running", "running"]]},
];

// traffic: the admin API's live traffic events (one a second) as charts,
// kept for the last minutes while the page is open.
export async function traffic(ctx) {
  const points = [];
  const errorsSeen = {}; // code -> count over the window
  const figs = charts.map((c) => {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "chart");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-labelledby", `cap-${c.id}`);
    const now = h("span", {class: "legend", id: `now-${c.id}`});
    const fig = h("figure", {id: `chart-${c.id}`}, h("figcaption", {id: `cap-${c.id}`}, h("strong", null, c.title), now), svg);
    return {c, svg, now, fig};
  });
  const errors = h("div", {id: "errors"});
  const flows = h("div", {id: "flows"});
  const live = h("p", {id: "live"}, "Connecting…");
  ctx.root.append(h("h1", {id: "title"}, "Traffic"), live, h("div", {class: "charts"}, figs.map((f) => f.fig)),
    h("h2", null, "Queue by tenant"), flows,
    h("h2", null, "Errors by code (last 5 minutes)"), errors);

  const render = () => {
    for (const {c, svg, now} of figs) {
      const series = c.series.map(([, f]) => points.map((p) => p[f]));
      // The window grows from a minute to CAPACITY, so that a page just
      // opened is not a sliver at the right edge.
      draw(svg, series, Math.min(CAPACITY, Math.max(60, points.length)), c.unit);
      const last = points[points.length - 1] || {};
      now.replaceChildren(...c.series.flatMap(([label, f], k) => [h("span", {class: "s" + k}, `${label} ${fmt(last[f])}`), " "]));
    }
    const last = points[points.length - 1] || {};
    const fl = last.flows || [];
    flows.replaceChildren(fl.length ? h("table", null,
      h("thead", null, h("tr", null, ["Tenant", "Band", "Model", "Queued"].map((t) => h("th", null, t)))),
      h("tbody", null, fl.map((f) => h("tr", null, h("td", null, f.tenant), h("td", null, f.band), h("td", null, f.model),
        h("td", {class: "num"}, String(f.queued))))))
      : h("p", null, "Nothing queued."));
    const codes = Object.keys(errorsSeen).sort();
    errors.replaceChildren(codes.length ? h("ul", null, codes.map((k) => h("li", null, `${k.startsWith("stream:") ? "stream error " + k.slice(7) : "HTTP " + k}: ${errorsSeen[k]}`)))
      : h("p", null, "None."));
  };
  render();
  // Reconnects after a dropped stream (a restart), until the page is left.
  while (!ctx.signal.aborted) {
    try {
      const r = await admin("/events/traffic", {raw: true, signal: ctx.signal});
      live.textContent = "Live: one point a second.";
      for await (const data of events(r)) {
        const e = JSON.parse(data);
        points.push(e);
        for (const [k, n] of Object.entries(e.errors || {})) errorsSeen[k] = (errorsSeen[k] || 0) + n;
        if (points.length > CAPACITY) {
          const old = points.shift();
          for (const [k, n] of Object.entries(old.errors || {})) if ((errorsSeen[k] -= n) <= 0) delete errorsSeen[k];
        }
        live.dataset.points = String(points.length);
        live.textContent = `Live: ${e.workers} workers, ${e.running} running, ${e.waiting} waiting, ${fmt(e.active_streams)} streams open.`;
        render();
      }
    } catch (e) {
      if (ctx.signal.aborted) return;
      live.textContent = "Disconnected: " + e.message + "; reconnecting…";
    }
    await new Promise((res) => setTimeout(res, 2000));
  }
}
