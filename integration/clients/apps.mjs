// Application code against tokenbus, unchanged: the Vercel AI SDK's
// generateObject (chat and Responses models) and a streamText whose tool is
// called and whose answer uses its result. Driven by integration/apps_test.go
// against tokenbus dev (the sim).
// Usage: node apps.mjs BASE_URL MODEL
import { createOpenAI } from "@ai-sdk/openai";
import { generateObject, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

function check(cond, msg) {
  if (!cond) {
    console.log("FAIL:", msg);
    process.exit(1);
  }
}

const [base, model] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: base + "/v1", apiKey: "unused" });
const City = z.object({ name: z.string(), population: z.number().int(), coastal: z.boolean() });

for (const [kind, m] of [["chat", openai.chat(model)], ["responses", openai.responses(model)]]) {
  const { object } = await generateObject({ model: m, schema: City, prompt: "Describe a city." });
  check(typeof object.name === "string" && typeof object.coastal === "boolean", `generateObject ${kind}: ${JSON.stringify(object)}`);
}

const WEATHER = "sunny and 21 degrees";
for (const [kind, m] of [["chat", openai.chat(model)], ["responses", openai.responses(model)]]) {
  let called = 0;
  const result = streamText({
    model: m,
    tools: {
      get_weather: tool({
        description: "Get the current weather in a city",
        inputSchema: z.object({ city: z.string() }),
        execute: async () => { called++; return WEATHER; },
      }),
    },
    stopWhen: stepCountIs(3),
    prompt: "What is the weather in Paris?",
  });
  let text = "";
  for await (const delta of result.textStream) text += delta;
  check(called === 1 && text.includes(WEATHER), `streamText ${kind}: called ${called}, text ${JSON.stringify(text)}`);
}
console.log("vercel ai ok");
