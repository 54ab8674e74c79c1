// OpenAI's official Node client (`openai` from npm, installed by scripts/setup-openai-client.sh)
// against a running `pml serve` on the default model: chat with a required tool (whole and
// streamed), and the Responses API (text, streamed, a function tool). Run by
// tests/openai_client.rs with NODE_PATH at the installed package: `node openai_client_node.cjs URL`.
// Each check prints one line; the first failure throws and the process exits non-zero.

const OpenAI = require("openai");

const client = new OpenAI({ baseURL: process.argv[2].replace(/\/$/, "") + "/v1", apiKey: "unused",
  maxRetries: 0, timeout: 120000 });
const MODEL = "pml";
const PARAMETERS = { type: "object", properties: { city: { type: "string" } }, required: ["city"],
  additionalProperties: false };
const CHAT_TOOL = { type: "function", function: { name: "get_weather",
  description: "The current weather in a city.", parameters: PARAMETERS } };
const RESPONSES_TOOL = { type: "function", name: "get_weather",
  description: "The current weather in a city.", parameters: PARAMETERS };
const ASK = [{ role: "user", content: "What is the weather in Paris right now?" }];

function check(name, condition, detail) {
  if (!condition) throw new Error(`${name}: ${JSON.stringify(detail)}`);
  console.log(`ok  ${name}`);
}

function hasCity(argumentsText) {
  return typeof JSON.parse(argumentsText).city === "string";
}

async function main() {
  const chat = await client.chat.completions.create({ model: MODEL, messages: ASK,
    tools: [CHAT_TOOL], tool_choice: "required", max_tokens: 60 });
  const call = chat.choices[0].message.tool_calls?.[0];
  check("chat, required tool: a call", call && call.function.name === "get_weather", chat);
  check("chat, required tool: arguments parse", hasCity(call.function.arguments), call);
  check("chat, required tool: finish reason", chat.choices[0].finish_reason === "tool_calls", chat);

  const answer = await client.chat.completions.create({ model: MODEL, tools: [CHAT_TOOL],
    max_tokens: 30, messages: [...ASK, chat.choices[0].message,
      { role: "tool", tool_call_id: call.id, content: "22 degrees Celsius, sunny" }] });
  check("chat, tool result: answered", answer.choices[0].message, answer);

  const stream = await client.chat.completions.create({ model: MODEL, messages: ASK,
    tools: [CHAT_TOOL], tool_choice: "required", max_tokens: 60, stream: true });
  let streamedArguments = "";
  let finish = null;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      finish = choice.finish_reason ?? finish;
      for (const delta of choice.delta.tool_calls ?? []) {
        streamedArguments += delta.function?.arguments ?? "";
      }
    }
  }
  check("chat stream, required tool: arguments", hasCity(streamedArguments), streamedArguments);
  check("chat stream, required tool: finish reason", finish === "tool_calls", finish);

  const text = await client.responses.create({ model: MODEL, input: "Name one colour.",
    instructions: "Answer in one word.", max_output_tokens: 8 });
  check("responses: output_text", text.output_text.trim().length > 0, text);
  check("responses: completed", text.status === "completed", text);

  const events = await client.responses.create({ model: MODEL, input: "Name one colour.",
    instructions: "Answer in one word.", max_output_tokens: 8, stream: true });
  let deltas = "";
  let last = null;
  for await (const event of events) {
    if (event.type === "response.output_text.delta") deltas += event.delta;
    last = event;
  }
  check("responses stream: deltas make the text", deltas === text.output_text, [deltas, text]);
  check("responses stream: completed last", last.type === "response.completed", last);

  const called = await client.responses.create({ model: MODEL, input: "What is the weather in Paris?",
    tools: [RESPONSES_TOOL], tool_choice: "required", max_output_tokens: 60 });
  const item = called.output.find((entry) => entry.type === "function_call");
  check("responses, required tool: a function_call", item && item.name === "get_weather", called);
  check("responses, required tool: arguments parse", hasCity(item.arguments), item);
  const followed = await client.responses.create({ model: MODEL, previous_response_id: called.id,
    tools: [RESPONSES_TOOL], max_output_tokens: 30,
    input: [{ type: "function_call_output", call_id: item.call_id, output: "22 degrees, sunny" }] });
  check("responses, tool result via previous_response_id",
    followed.usage.input_tokens > called.usage.input_tokens, [followed.usage, called.usage]);

  console.log(JSON.stringify({ passed: true }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
