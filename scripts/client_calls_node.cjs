// The Node client libraries' calls that once failed against `pml serve` (the Python ones are in
// client_calls.py): a tool call with `tool_choice: auto`, which must come back as a call, through
// openai-node's `runTools` and the Vercel AI SDK's `generateText`. Each runs when its packages
// are installed under the folder given (else it is reported as skipped). Greedy; prints a line
// per call and `N passed, N failed`.
//
// Usage: node scripts/client_calls_node.cjs http://127.0.0.1:8080 [--model NAME] [--modules DIR]
// DIR holds node_modules with `openai`, `ai`, `@ai-sdk/openai-compatible` and `zod`, e.g.
//   (cd /tmp/node-clients && npm install openai@6 ai@6 @ai-sdk/openai-compatible zod)
"use strict";

const QUESTION = "What is the weather in Paris?";
const PARAMETERS = {
  type: "object",
  properties: { city: { type: "string" } },
  required: ["city"],
};

function getWeather(city) {
  return `It is sunny and 21 degrees in ${city}.`;
}

function load(modules, name) {
  return require(require.resolve(name, { paths: [modules] }));
}

async function openaiRunTools(base, model, modules) {
  const OpenAI = load(modules, "openai").default;
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "none" });
  const calls = [];
  const completions = client.chat.completions.runTools
    ? client.chat.completions
    : client.beta.chat.completions;
  const runner = completions.runTools({
    model,
    messages: [{ role: "user", content: QUESTION }],
    temperature: 0,
    max_tokens: 96,
    tools: [
      {
        type: "function",
        function: {
          name: "get_weather",
          description: "Get the current weather in a city",
          parameters: PARAMETERS,
          parse: JSON.parse,
          function: ({ city }) => {
            calls.push(city);
            return getWeather(city);
          },
        },
      },
    ],
  });
  await runner.finalContent();
  if (calls.length === 0 || typeof calls[0] !== "string") {
    throw new Error(`the tool was not called: ${JSON.stringify(runner.messages)}`);
  }
}

async function aiSdkGenerateText(base, model, modules) {
  const { generateText, tool, stepCountIs } = load(modules, "ai");
  const { createOpenAICompatible } = load(modules, "@ai-sdk/openai-compatible");
  const { z } = load(modules, "zod");
  const provider = createOpenAICompatible({ name: "pml", baseURL: `${base}/v1` });
  const calls = [];
  const result = await generateText({
    model: provider(model),
    prompt: QUESTION,
    temperature: 0,
    maxOutputTokens: 96,
    stopWhen: stepCountIs(2),
    tools: {
      get_weather: tool({
        description: "Get the current weather in a city",
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => {
          calls.push(city);
          return getWeather(city);
        },
      }),
    },
  });
  if (calls.length === 0) {
    throw new Error(`the tool was not called: ${JSON.stringify(result.text)}`);
  }
}

const CALLS = [
  ["openai", "openai-node runTools, tool_choice auto", openaiRunTools],
  ["ai", "AI SDK generateText with a tool", aiSdkGenerateText],
];

async function main() {
  const args = process.argv.slice(2);
  const option = (name, fallback) => {
    const index = args.indexOf(name);
    return index >= 0 ? args[index + 1] : fallback;
  };
  const base = (args[0] || "").replace(/\/$/, "");
  if (!base.startsWith("http")) {
    console.error("usage: node scripts/client_calls_node.cjs http://HOST:PORT [--model NAME] [--modules DIR]");
    process.exit(2);
  }
  const model = option("--model", "pml");
  const modules = option("--modules", process.cwd());
  let [passed, failed, skipped] = [0, 0, 0];
  for (const [module, what, call] of CALLS) {
    try {
      require.resolve(module, { paths: [modules] });
    } catch {
      console.log(`skipped  ${what} (${module} is not installed under ${modules})`);
      skipped += 1;
      continue;
    }
    try {
      await call(base, model, modules);
      console.log(`passed   ${what}`);
      passed += 1;
    } catch (error) {
      console.log(`FAILED   ${what}: ${error && error.message}`);
      failed += 1;
    }
  }
  console.log(`${passed} passed, ${failed} failed, ${skipped} skipped`);
  process.exit(failed ? 1 : 0);
}

main();
