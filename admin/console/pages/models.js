import {admin} from "../api.js";
import {h, table, field, when} from "../dom.js";

const statusClass = {serving: "ok", loaded: "ok", available: "ok", no_workers: "bad"};

// models: registered models and adapters, where each is served; register
// and unregister an adapter.
export async function models(ctx) {
  const body = h("div");
  const name = h("input", {name: "name", required: true, autocomplete: "off"});
  const base = h("select", {name: "base", required: true});
  const path = h("input", {name: "path", required: true, placeholder: "sim://my-adapter or /weights/...", autocomplete: "off"});
  const form = h("form", {class: "inline", id: "register-adapter", "aria-label": "Register an adapter"},
    field("Adapter name", name), field("Base model", base), field("Weights (path or URI)", path),
    h("button", {type: "submit", class: "primary"}, "Register adapter"));
  ctx.root.append(h("h1", {id: "title"}, "Models and adapters"), body, h("h2", null, "Register a LoRA adapter"), form);

  const load = async () => {
    let list;
    try {
      list = (await admin("/models", {signal: ctx.signal})).data;
    } catch (e) {
      if (!ctx.signal.aborted) ctx.say(e.message, true);
      return;
    }
    const bases = list.filter((m) => !m.base).map((m) => m.name);
    if (base.options.length !== bases.length) {
      base.replaceChildren(...bases.map((b) => h("option", {value: b}, b)));
    }
    const rows = list.map((m) => [
      h("strong", null, m.name),
      m.base ? "adapter of " + m.base : "base model",
      m.path || "",
      h("span", {class: "pill " + (statusClass[m.status] || "")}, m.status.replace("_", " ")),
      (m.workers || []).join(", "),
      when(m.created),
      m.base ? h("button", {type: "button", class: "danger", "aria-label": `Unregister ${m.name}`, onclick: () => remove(m.name)}, "Unregister") : "",
    ]);
    body.replaceChildren(table("models", "Models and adapters", ["Name", "Kind", "Weights", "Status", "Workers", "Created", "Actions"],
      rows, "No model is registered."));
  };
  const remove = async (n) => {
    if (!confirm(`Unregister ${n}? Workers unload it.`)) return;
    try {
      const r = await admin(`/adapters/${encodeURIComponent(n)}`, {method: "DELETE"});
      const failed = (r.unload || []).filter((u) => !u.ok).map((u) => u.worker);
      ctx.say(`${n} unregistered` + (failed.length ? `; not unloaded on ${failed.join(", ")}` : "."), failed.length > 0);
    } catch (e) {
      ctx.say(e.message, true);
    }
    load();
  };
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await admin("/adapters", {method: "POST", body: {name: name.value.trim(), base: base.value, path: path.value.trim()}});
      ctx.say(`${name.value.trim()} registered on ${base.value}: the first request for it loads it.`);
      form.reset();
    } catch (e) {
      ctx.say(e.message, true);
    }
    load();
  });
  ctx.every(3000, load);
}
