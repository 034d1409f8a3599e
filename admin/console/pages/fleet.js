import {admin} from "../api.js";
import {h, table, ago} from "../dom.js";

// fleet: the live worker table, every 2 s, with a drain button per worker.
export async function fleet(ctx) {
  const body = h("div");
  ctx.root.append(h("h1", {id: "title"}, "Fleet"), h("p", null, "Every worker that heartbeats, refreshed every 2 s."), body);
  const load = async () => {
    let list;
    try {
      list = (await admin("/workers", {signal: ctx.signal})).data;
    } catch (e) {
      if (!ctx.signal.aborted) ctx.say(e.message, true);
      return;
    }
    const rows = list.map((w) => [
      h("strong", null, w.worker),
      w.engine + (w.version ? " " + w.version : ""),
      (w.models || []).filter((m) => !(w.adapters || []).includes(m)).join(", "),
      [(w.adapters || []).join(", "), (w.loading || []).length ? h("span", {class: "warn"}, ` loading ${w.loading.join(", ")}`) : null],
      `${w.running} / ${w.waiting}`,
      `${Math.round((w.kv_cache_usage || 0) * 100)}%`,
      w.draining ? h("span", {class: "pill warn"}, "draining") : w.healthy ? h("span", {class: "pill ok"}, "healthy") : h("span", {class: "pill bad"}, "unhealthy"),
      ago(w.last_seen),
      h("button", {type: "button", class: "danger", disabled: w.draining, "aria-label": `Drain ${w.worker}`, onclick: () => drain(w.worker)}, "Drain"),
    ]);
    body.replaceChildren(table("workers", "Workers", ["Worker", "Engine", "Models", "Adapters", {name: "Running / waiting", num: true},
      {name: "KV cache", num: true}, "State", "Last heartbeat", "Actions"], rows, "No worker is heartbeating."));
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
