import {admin} from "../api.js";
import {h, table, field, when} from "../dom.js";

// keys: API keys (create, shown once; revoke) and usage per key and model.
export async function keys(ctx) {
  const body = h("div"), usage = h("div"), hourly = h("div"), shown = h("div", {"aria-live": "polite"});
  const name = h("input", {name: "name", autocomplete: "off"});
  const tenant = h("input", {name: "tenant", required: true, autocomplete: "off"});
  const models = h("input", {name: "models", placeholder: "every model", autocomplete: "off"});
  const rpm = h("input", {name: "rpm", type: "number", min: "0", value: "0", inputmode: "numeric"});
  const tpm = h("input", {name: "tpm", type: "number", min: "0", value: "0", inputmode: "numeric"});
  const bandSelect = (value) => h("select", {name: "band"}, ["critical", "interactive", "batch"].map((b) =>
    h("option", b === value ? {value: b, selected: true} : {value: b}, b)));
  const band = bandSelect("interactive");
  const weight = h("input", {name: "weight", type: "number", min: "1", max: "1000", value: "1", inputmode: "numeric"});
  const form = h("form", {class: "inline", id: "create-key", "aria-label": "Create an API key"},
    field("Name", name), field("Tenant", tenant), field("Models (comma-separated)", models),
    field("Requests / min (0: no limit)", rpm), field("Tokens / min (0: no limit)", tpm),
    field("Band", band), field("Weight in its band", weight),
    h("button", {type: "submit", class: "primary"}, "Create key"));
  ctx.root.append(h("h1", {id: "title"}, "API keys and usage"), h("h2", null, "Create a key"), form, shown,
    h("h2", null, "Keys"), body, h("h2", null, "Usage per key and model"),
    h("p", null, "Totals of finished requests since the store began (requests without a key count as anonymous)."), usage,
    h("h2", null, "Usage per hour, last 24 hours"), hourly);

  const load = async () => {
    try {
      const [k, u, hu] = await Promise.all([admin("/keys", {signal: ctx.signal}), admin("/usage", {signal: ctx.signal}),
        admin("/usage?by=hour&hours=24", {signal: ctx.signal})]);
      const names = Object.fromEntries(k.data.map((x) => [x.id, x.name]));
      body.replaceChildren(table("keys", "API keys", ["Name", "Id", "Tenant", "Models", {name: "RPM", num: true}, {name: "TPM", num: true},
        "Band", {name: "Weight", num: true}, "Key", "Created", "Actions"], k.data.map((x) => [
        h("strong", null, x.name || "–"), x.id, x.tenant, (x.models || []).join(", ") || "every model",
        x.rpm || "–", x.tpm || "–", flowControl(x, "band"), flowControl(x, "weight"), h("code", null, x.redacted_key), when(x.created),
        h("button", {type: "button", class: "danger", "aria-label": `Revoke ${x.name || x.id}`, onclick: () => revoke(x)}, "Revoke"),
      ]), "No API key yet."));
      usage.replaceChildren(table("usage", "Usage", ["Key", "Model", {name: "Requests", num: true}, {name: "Prompt tokens", num: true},
        {name: "Completion tokens", num: true}, {name: "Total tokens", num: true}], u.data.map((x) => [
        names[x.key_id] ? `${names[x.key_id]} (${x.key_id})` : x.key_id, x.model, x.requests, x.prompt_tokens, x.completion_tokens, x.total_tokens,
      ]), "No usage yet."));
      hourly.replaceChildren(table("usage-hourly", "Usage per hour", ["Hour", "Key", "Model", {name: "Requests", num: true},
        {name: "Prompt tokens", num: true}, {name: "Completion tokens", num: true}, {name: "Total tokens", num: true}],
        hu.data.slice().reverse().map((x) => [
          when(x.hour), names[x.key_id] ? `${names[x.key_id]} (${x.key_id})` : x.key_id, x.model, x.requests,
          x.prompt_tokens, x.completion_tokens, x.total_tokens,
        ]), "No usage in the last 24 hours."));
    } catch (e) {
      if (!ctx.signal.aborted) ctx.say(e.message, true);
    }
  };
  // flowControl: a key's band or weight, changed in place (PATCH /keys/{id}).
  const flowControl = (k, what) => {
    const input = what === "band" ? bandSelect(k.band || "interactive")
      : h("input", {type: "number", min: "1", max: "1000", value: String(k.weight || 1), inputmode: "numeric", class: "narrow"});
    input.setAttribute("aria-label", `${what} of ${k.name || k.id}`);
    input.addEventListener("change", async () => {
      try {
        await admin(`/keys/${encodeURIComponent(k.id)}`, {method: "PATCH",
          body: what === "band" ? {band: input.value} : {weight: +input.value || 1}});
        ctx.say(`${k.name || k.id}: ${what} ${input.value}.`);
      } catch (e) {
        ctx.say(e.message, true);
      }
    });
    return input;
  };
  const revoke = async (k) => {
    if (!confirm(`Revoke ${k.name || k.id}? It stops working at once.`)) return;
    try {
      await admin(`/keys/${encodeURIComponent(k.id)}`, {method: "DELETE"});
      ctx.say(`${k.name || k.id} revoked.`);
    } catch (e) {
      ctx.say(e.message, true);
    }
    load();
  };
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const k = await admin("/keys", {method: "POST", body: {name: name.value.trim(), tenant: tenant.value.trim(),
        models: models.value.split(",").map((s) => s.trim()).filter(Boolean), rpm: +rpm.value || 0, tpm: +tpm.value || 0,
        band: band.value, weight: +weight.value || 1}});
      const copy = h("button", {type: "button", onclick: () => navigator.clipboard.writeText(k.key).then(() => ctx.say("Copied."))}, "Copy");
      shown.replaceChildren(h("p", null, h("strong", null, "The new key, shown this once: "), "store it now."),
        h("p", {class: "secret", id: "new-key"}, k.key), copy);
      form.reset();
      copy.focus();
    } catch (e) {
      ctx.say(e.message, true);
    }
    load();
  });
  ctx.every(5000, load);
}
