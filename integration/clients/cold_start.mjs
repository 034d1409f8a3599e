// The official openai-node SDK, with its default timeouts and retries,
// through a cold start: driven by integration/capacity_test.go, which starts
// the first worker about 10 s after these requests arrive.
// Usage: node cold_start.mjs BASE_URL MODEL
import OpenAI from "openai";

const [base, model] = process.argv.slice(2);
const c = new OpenAI({ baseURL: base + "/v1", apiKey: "unused" }); // defaults: 10 min timeout, 2 retries
const start = Date.now();

async function plain() {
  const r = await c.chat.completions.create({ model, max_tokens: 8, messages: [{ role: "user", content: "Hello" }] });
  if (!r.choices[0].message.content || r.usage.completion_tokens !== 8) throw new Error("plain: " + JSON.stringify(r));
  return (Date.now() - start) / 1000;
}

async function streamed() {
  let text = "";
  for await (const ch of await c.chat.completions.create({ model, max_tokens: 8, stream: true, messages: [{ role: "user", content: "Stream" }] })) {
    for (const choice of ch.choices) text += choice.delta.content ?? "";
  }
  if (!text) throw new Error("empty stream");
  return (Date.now() - start) / 1000;
}

const [a, b] = await Promise.all([plain(), streamed()]);
console.log(`node cold start ok: plain ${a.toFixed(1)}s, stream ${b.toFixed(1)}s`);
