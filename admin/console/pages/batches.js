import {admin} from "../api.js";
import {h, table, when} from "../dom.js";

const ended = new Set(["completed", "failed", "expired", "cancelled"]);

// batches: every tenant's batches with progress; cancel, download output.
export async function batches(ctx) {
  const body = h("div");
  ctx.root.append(h("h1", {id: "title"}, "Batches"),
    h("p", null, "Every tenant's batches, newest first, refreshed every 3 s. Cancel and download act for the batch's tenant through the admin API."), body);
  if (!ctx.config.batches) {
    body.replaceChildren(h("p", null, "This gateway serves no batches (--batches=false, or JetStream is unavailable)."));
    return;
  }
  const load = async () => {
    let list;
    try {
      list = (await admin("/batches", {signal: ctx.signal})).data;
    } catch (e) {
      if (!ctx.signal.aborted) ctx.say(e.message, true);
      return;
    }
    body.replaceChildren(table("batches", "Batches", ["Batch", "Tenant", "Model", "Status", "Progress", "Created", "Actions"], list.map((b) => {
      const c = b.request_counts || {total: 0, completed: 0, failed: 0};
      const done = c.completed + c.failed;
      return [
        h("code", null, b.id), b.tenant, b.model || "", h("span", {class: "pill " + (b.status === "failed" ? "bad" : ended.has(b.status) ? "" : "ok")}, b.status),
        [h("progress", {max: String(c.total || 1), value: String(done), "aria-label": `${b.id}: ${done} of ${c.total} lines`}),
          ` ${done}/${c.total}` + (c.failed ? ` (${c.failed} failed)` : "") + (b.queued_lines ? `, ${b.queued_lines} queued` : "")],
        when(b.created_at),
        [ended.has(b.status) || b.status === "cancelling" ? null : h("button", {type: "button", class: "danger", "aria-label": `Cancel ${b.id}`, onclick: () => cancel(b.id)}, "Cancel"),
          b.output_file_id ? h("button", {type: "button", "aria-label": `Download the output of ${b.id}`, onclick: () => download(b.id, "output")}, "Output") : null,
          b.error_file_id ? h("button", {type: "button", "aria-label": `Download the errors of ${b.id}`, onclick: () => download(b.id, "errors")}, "Errors") : null],
      ];
    }), "No batch yet."));
  };
  const cancel = async (id) => {
    if (!confirm(`Cancel ${id}? Lines not yet run are answered as cancelled.`)) return;
    try {
      await admin(`/batches/${encodeURIComponent(id)}/cancel`, {method: "POST"});
      ctx.say(`${id} is cancelling.`);
    } catch (e) {
      ctx.say(e.message, true);
    }
    load();
  };
  // download fetches with the token (a plain link cannot send it) and saves
  // the body through an object URL.
  const download = async (id, which) => {
    try {
      const r = await admin(`/batches/${encodeURIComponent(id)}/${which}`, {raw: true});
      const url = URL.createObjectURL(await r.blob());
      const a = h("a", {href: url, download: `${id}-${which}.jsonl`});
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      ctx.say(e.message, true);
    }
  };
  ctx.every(3000, load);
}
