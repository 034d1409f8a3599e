import {admin, apiBase, events} from "../api.js";
import {h, field} from "../dom.js";
import {fmt} from "../chart.js";

const KEYSTORE = "tokenbus.api-key";

// playground: a chat with any served model or adapter, streamed from the
// OpenAI API (fetch + ReadableStream), with its TTFT and tokens/s.
export async function playground(ctx) {
  const base = apiBase(ctx.config.api_addr);
  const model = h("select", {name: "model", required: true});
  const maxTokens = h("input", {name: "max_tokens", type: "number", min: "1", value: "64", inputmode: "numeric"});
  const key = h("input", {name: "api_key", type: "password", autocomplete: "off", value: sessionStorage.getItem(KEYSTORE) || ""});
  const prompt = h("textarea", {name: "prompt", required: true, rows: "3"});
  const send = h("button", {type: "submit", class: "primary"}, "Send");
  const stopButton = h("button", {type: "button", disabled: true}, "Stop");
  const clear = h("button", {type: "button"}, "New chat");
  const chat = h("div", {class: "chat", id: "chat", "aria-live": "polite"});
  const stats = h("p", {class: "stats", id: "stats"});
  const form = h("form", {id: "playground", "aria-label": "Chat"},
    h("div", {class: "inline"}, field("Model or adapter", model), field("Max tokens", maxTokens),
      ctx.config.api_auth ? field("API key (the OpenAI API needs one)", key) : null),
    field("Message", prompt), h("div", {class: "inline"}, send, stopButton, clear));
  ctx.root.append(h("h1", {id: "title"}, "Playground"), h("p", null, `Streams from the OpenAI API at ${base}/v1.`), form, stats, chat);

  const list = (await admin("/models", {signal: ctx.signal})).data.filter((m) => m.status !== "no_workers");
  model.replaceChildren(...list.map((m) => h("option", {value: m.name}, m.base ? `${m.name} (adapter of ${m.base})` : m.name)));
  const messages = [];
  let running = null;

  clear.addEventListener("click", () => { messages.length = 0; chat.replaceChildren(); stats.replaceChildren(); prompt.focus(); });
  stopButton.addEventListener("click", () => running && running.abort());
  ctx.signal.addEventListener("abort", () => running && running.abort());
  // Ctrl/Cmd+Enter sends.
  prompt.addEventListener("keydown", (ev) => { if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) form.requestSubmit(); });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (running) return;
    const text = prompt.value.trim();
    if (!text) return;
    if (ctx.config.api_auth) sessionStorage.setItem(KEYSTORE, key.value.trim());
    messages.push({role: "user", content: text});
    chat.append(h("div", {class: "msg user"}, text));
    const out = h("div", {class: "msg assistant", "aria-busy": "true"});
    chat.append(out);
    prompt.value = "";
    running = new AbortController();
    send.disabled = true;
    stopButton.disabled = false;
    const headers = {"Content-Type": "application/json"};
    if (ctx.config.api_auth && key.value.trim()) headers.Authorization = "Bearer " + key.value.trim();
    const t0 = performance.now();
    let first = 0, chunks = 0, reply = "", usage = null, finished = false;
    try {
      const r = await fetch(base + "/v1/chat/completions", {method: "POST", headers, signal: running.signal, body: JSON.stringify({
        model: model.value, messages, stream: true, stream_options: {include_usage: true}, max_tokens: +maxTokens.value || undefined})});
      if (!r.ok) {
        let msg = `HTTP ${r.status}`;
        try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
        throw new Error(msg);
      }
      for await (const data of events(r)) {
        if (data === "[DONE]") { finished = true; break; }
        const c = JSON.parse(data);
        if (c.error) throw new Error(c.error.message);
        if (c.usage) usage = c.usage;
        for (const ch of c.choices || []) {
          const d = (ch.delta && ch.delta.content) || "";
          if (!d) continue;
          if (!first) first = performance.now();
          chunks++;
          reply += d;
          out.textContent = reply;
        }
      }
    } catch (e) {
      out.append(h("div", {class: "bad"}, e.name === "AbortError" ? "(stopped)" : "Error: " + e.message));
    }
    const end = performance.now();
    const tokens = usage ? usage.completion_tokens : chunks;
    const rate = first && end > first && tokens > 1 ? (tokens - 1) / ((end - first) / 1000) : null;
    stats.replaceChildren(
      h("span", null, "TTFT ", h("strong", {id: "ttft"}, first ? `${fmt(first - t0)} ms` : "–")),
      h("span", null, "tokens/s ", h("strong", {id: "tps"}, rate ? fmt(rate) : "–")),
      h("span", null, "tokens ", h("strong", {id: "tokens"}, String(tokens))),
      h("span", null, "total ", h("strong", null, `${fmt((end - t0) / 1000)} s`)));
    out.removeAttribute("aria-busy");
    out.dataset.done = finished ? "1" : "0";
    if (reply) messages.push({role: "assistant", content: reply});
    running = null;
    send.disabled = false;
    stopButton.disabled = true;
    prompt.focus();
  });
  prompt.focus();
}
