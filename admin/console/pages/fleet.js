import {admin} from "../api.js";
import {h, table, ago} from "../dom.js";

// fleet: the live worker table, every 2 s, with a drain button per worker;
// for workers of several models, what each holds and can switch to, and
// the switches lately (docs/capacity.md); each worker's role in
// prefill/decode disaggregation (docs/disaggregation.md).
export async function fleet(ctx) {
  const body = h("div");
  const recent = h("div");
  ctx.root.append(h("h1", {id: "title"}, "Fleet"), h("p", null, "Every worker that heartbeats, refreshed every 2 s."), body, recent);
  const load = async () => {
    let list, switches;
    try {
      [list, switches] = await Promise.all([admin("/workers", {signal: ctx.signal}), admin("/workers/switches", {signal: ctx.signal})]);
    } catch (e) {
      if (!ctx.signal.aborted) ctx.say(e.message, true);
      return;
    }
    const rows = list.data.map((w) => [
      h("strong", null, w.worker),
      w.role || "both",
      w.engine + (w.version ? " " + w.version : ""),
      models(w),
      [(w.adapters || []).join(", "), (w.loading || []).length ? h("span", {class: "warn"}, ` loading ${w.loading.join(", ")}`) : null],
      `${w.running} / ${w.waiting}`,
      `${Math.round((w.kv_cache_usage || 0) * 100)}%`,
      state(w),
      ago(w.last_seen),
      h("button", {type: "button", class: "danger", disabled: w.draining, "aria-label": `Drain ${w.worker}`, onclick: () => drain(w.worker)}, "Drain"),
    ]);
    body.replaceChildren(table("workers", "Workers", ["Worker", "Role", "Engine", "Models", "Adapters", {name: "Running / waiting", num: true},
      {name: "KV cache", num: true}, "State", "Last heartbeat", "Actions"], rows, "No worker is heartbeating."));
    // Shown once some worker can switch models, or has.
    if (!switches.data.length && !list.data.some((w) => (w.can_serve || []).length)) {
      recent.replaceChildren();
      return;
    }
    const srows = switches.data.map((s) => [
      h("strong", null, s.worker),
      `${s.from || "?"} → ${s.to}`,
      s.started ? ago(s.started) : "–",
      s.started && s.ended ? seconds(new Date(s.ended) - new Date(s.started)) : "–",
      !s.ended ? h("span", {class: "pill warn"}, "switching") : s.ok ? h("span", {class: "pill ok"}, "done") : h("span", {class: "pill bad"}, "failed"),
    ]);
    recent.replaceChildren(h("h2", null, "Model switches"),
      table("switches", "Model switches, newest first", ["Worker", "Switch", "Began", {name: "Took", num: true}, "Result"], srows,
        "No model switch yet."));
  };
  const drain = async (id) => {
    if (!confirm(`Drain ${id}? It stops taking requests, finishes what it runs and leaves.`)) return;
    try {
      await admin(`/workers/${encodeURIComponent(id)}/drain`, {method: "POST"});
      ctx.say(`${id} is draining.`);
    } catch (e) {
      ctx.say(e.message, true);
    }
    load();
  };
  ctx.every(2000, load);
}

// models is a worker's base models; for one of several models, the others
// it can switch to and when the one it holds was loaded.
function models(w) {
  const base = (w.models || []).filter((m) => !(w.adapters || []).includes(m)).join(", ");
  const others = (w.can_serve || []).filter((m) => !(w.models || []).includes(m));
  if (!(w.can_serve || []).length) return base;
  return [base || "none", h("br"), h("small", null, `loaded ${w.loaded_at ? ago(new Date(w.loaded_at).toISOString()) : "?"}`,
    others.length ? `; can switch to ${others.join(", ")}` : "")];
}

function state(w) {
  if (w.draining) return h("span", {class: "pill warn"}, "draining");
  if (w.switching) return h("span", {class: "pill warn"}, `switching to ${w.switching}`);
  return w.healthy ? h("span", {class: "pill ok"}, "healthy") : h("span", {class: "pill bad"}, "unhealthy");
}

function seconds(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}
