// The official openai-node SDK's Responses API against tokenbus (issue 17);
// driven by integration/responses_test.go. Usage: node node_responses.mjs BASE_URL
import OpenAI from "openai";

function check(cond, msg) {
  if (!cond) {
    console.log("FAIL:", msg);
    process.exit(1);
  }
}

const c = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "unused", maxRetries: 0, timeout: 60000 });
const m = "llama-8b";

const r = await c.responses.create({ model: m, input: "hello", max_output_tokens: 8 });
check(r.object === "response" && r.output_text && r.usage.output_tokens > 0, "create: " + JSON.stringify(r));

const types = [];
let text = "";
for await (const ev of await c.responses.create({ model: m, input: [{ role: "user", content: "hi" }], max_output_tokens: 8, stream: true })) {
  types.push(ev.type);
  if (ev.type === "response.output_text.delta") text += ev.delta;
}
check(types[0] === "response.created" && types.at(-1).startsWith("response.") && text, "stream: " + types.join(","));

const s = c.responses.stream({ model: m, input: "stream helper" });
const final = await s.finalResponse();
check(final.status === "completed" && final.output[0].content[0].text, "stream helper: " + JSON.stringify(final));

const got = await c.responses.retrieve(r.id);
check(got.id === r.id && got.output[0].content[0].text === r.output_text, "retrieve: " + JSON.stringify(got));

const b = await c.responses.create({ model: m, input: "background", max_output_tokens: 30, background: true });
const seqs = [];
for await (const ev of await c.responses.retrieve(b.id, { stream: true, starting_after: 1 })) seqs.push(ev.sequence_number);
check(seqs[0] === 2 && seqs.every((s, i) => s === 2 + i), "retrieve stream: " + seqs.join(","));

const bc = await c.responses.create({ model: m, input: "cancel me", max_output_tokens: 5000, background: true });
await c.responses.cancel(bc.id);
check((await c.responses.retrieve(bc.id)).status === "cancelled", "cancel");

await c.responses.del(r.id);
let gone = false;
try { await c.responses.retrieve(r.id); } catch (e) { gone = e.status === 404; }
check(gone, "delete");
console.log("node responses ok");
