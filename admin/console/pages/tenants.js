import {admin} from "../api.js";
import {h, table, field} from "../dom.js";

// The quotas a tenant has, as the admin API names them, with their labels.
const quotas = [
  ["file_bytes", "File bytes"], ["files", "Files"], ["batches", "Batches not ended"],
  ["stored_responses", "Stored responses"], ["background", "Background responses"], ["resumable", "Resumable streams"],
];

// size is a byte count for people.
function size(n) {
  if (n >= 1 << 30) return (n / (1 << 30)).toFixed(1) + " GiB";
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + " MiB";
  if (n >= 1 << 10) return (n / (1 << 10)).toFixed(1) + " KiB";
  return n + " B";
}

// tenants: every tenant with its quotas and what it keeps; a tenant's own
// quotas are edited in the form (0: the gateway's default, -1: no limit).
export async function tenants(ctx) {
  const body = h("div");
  const tenant = h("input", {name: "tenant", required: true, autocomplete: "off"});
  const inputs = Object.fromEntries(quotas.map(([k]) => [k, h("input", {name: k, type: "number", min: "-1", value: "0", inputmode: "numeric"})]));
  const form = h("form", {class: "inline", id: "set-quotas", "aria-label": "Set a tenant's quotas"},
    field("Tenant", tenant), quotas.map(([k, label]) => field(label, inputs[k])),
    h("button", {type: "submit", class: "primary"}, "Set quotas"));
  ctx.root.append(h("h1", {id: "title"}, "Tenants and quotas"),
    h("p", null, "What each tenant keeps in the shared stores, against its quotas (in use / limit), refreshed every 5 s. " +
      "A tenant's own quota of 0 takes the gateway's default (its --quota-* flags), -1 is no limit."),
    body, h("h2", null, "Set a tenant's quotas"), form);

  // limit is what a quota allows, as the table shows it.
  const limit = (v, fmt) => (v > 0 ? fmt(v) : "no limit");
  const edit = (t) => {
    tenant.value = t.tenant;
    for (const [k] of quotas) inputs[k].value = String(t.quotas[k] || 0);
    tenant.focus();
  };
  const load = async () => {
    let list;
    try {
      list = (await admin("/tenants", {signal: ctx.signal})).data;
    } catch (e) {
      if (!ctx.signal.aborted) ctx.say(e.message, true);
      return;
    }
    body.replaceChildren(table("tenants", "Tenants", ["Tenant", "Files", "File bytes", "Batches not ended",
      "Stored responses", "Background", "Resumable", "Actions"], list.map((t) => {
      const u = t.use || {}, e = t.effective;
      const own = (k) => (t.quotas[k] ? " (own)" : "");
      return [
        h("strong", null, t.tenant),
        `${u.files ?? "–"} / ${limit(e.files, String)}${own("files")}`,
        `${u.file_bytes != null ? size(u.file_bytes) : "–"} / ${limit(e.file_bytes, size)}${own("file_bytes")}`,
        `${u.batches ?? "–"} / ${limit(e.batches, String)}${own("batches")}`,
        `${limit(e.stored_responses, String)}${own("stored_responses")}`,
        `${limit(e.background, String)}${own("background")}`,
        `${limit(e.resumable, String)}${own("resumable")}`,
        h("button", {type: "button", "aria-label": `Edit the quotas of ${t.tenant}`, onclick: () => edit(t)}, "Edit"),
      ];
    }), "No tenant yet: tenants come with their API keys, or with quotas set here."));
  };
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const name = tenant.value.trim();
    const q = Object.fromEntries(quotas.map(([k]) => [k, Math.trunc(+inputs[k].value || 0)]));
    try {
      await admin(`/tenants/${encodeURIComponent(name)}/quotas`, {method: "PUT", body: q});
      ctx.say(`Quotas of ${name} set.`);
      form.reset();
    } catch (e) {
      ctx.say(e.message, true);
    }
    load();
  });
  ctx.every(5000, load);
}
