// The official openai-node SDK against tokenbus; driven by integration/sdk_test.go.
// Usage: node node_sdk.mjs BASE_URL
import OpenAI from "openai";

function check(cond, msg) {
  if (!cond) {
    console.log("FAIL:", msg);
    process.exit(1);
  }
}

const base = process.argv[2];
for (const url of [base + "/v1", base + "/predictions/llama-8b/1.0/v1"]) {
  const c = new OpenAI({ baseURL: url, apiKey: "unused", maxRetries: 0, timeout: 60000 });
  const r = await c.chat.completions.create({ model: "llama-8b", max_tokens: 10, messages: [{ role: "user", content: "Hello" }] });
  check(r.choices[0].message.content && r.usage.completion_tokens === 10, "chat: " + JSON.stringify(r));

  let text = "", usage = null;
  const ids = new Set();
  const stream = await c.chat.completions.create({
    model: "llama-8b", max_tokens: 12, stream: true, stream_options: { include_usage: true },
    messages: [{ role: "user", content: "Stream" }],
  });
  for await (const ch of stream) {
    ids.add(ch.id);
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) text += choice.delta.content ?? "";
  }
  check(text && usage && usage.completion_tokens === 12 && ids.size === 1, `chat stream: ${text} ${JSON.stringify(usage)}`);

  const comp = await c.completions.create({ model: "llama-8b", prompt: "Once upon a time", max_tokens: 6 });
  check(comp.choices[0].text && comp.usage.completion_tokens === 6, "completion: " + JSON.stringify(comp));
  let ctext = "";
  for await (const ch of await c.completions.create({ model: "llama-8b", prompt: "Once", max_tokens: 6, stream: true })) {
    for (const choice of ch.choices) ctext += choice.text;
  }
  check(ctext, "completion stream empty");

  const models = await c.models.list();
  check(models.data.some((m) => m.id === "llama-8b"), "models: " + JSON.stringify(models.data));

  try {
    await c.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] });
    check(false, "unknown model accepted");
  } catch (e) {
    // The TorchServe path names the model: a body naming another is refused.
    const torchserve = url.includes("/predictions/");
    check(torchserve ? e instanceof OpenAI.BadRequestError && e.code === "model_mismatch" : e instanceof OpenAI.NotFoundError,
      "unknown model: " + e);
  }

  // embeddings.create asks for base64 unless told otherwise, and decodes it.
  const texts = ["The cat sat on the mat.", "A cat sitting on the mat", "Interest rates rose again in March"];
  const emb = await c.embeddings.create({ model: "llama-8b", input: texts });
  const flt = await c.embeddings.create({ model: "llama-8b", input: texts, encoding_format: "float" });
  check(emb.data.length === 3 && emb.usage.prompt_tokens > 0, "embeddings: " + JSON.stringify(emb.usage));
  const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);
  const v = emb.data.map((d) => d.embedding);
  check(Array.isArray(v[0]) && v[0].length === 384, "base64 embedding not decoded: " + typeof v[0]);
  check(v.every((x, i) => x.every((y, j) => Math.abs(y - flt.data[i].embedding[j]) < 1e-6)), "base64 and float differ");
  check(dot(v[0], v[1]) > dot(v[0], v[2]) + 0.2, `similar ${dot(v[0], v[1])}, unrelated ${dot(v[0], v[2])}`);
}
console.log("node sdk ok");
