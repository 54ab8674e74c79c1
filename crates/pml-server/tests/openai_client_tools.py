"""Tool calling as OpenAI's official Python client (`openai`) does it, against a running
`pml serve` on the default model (Qwen2.5's template: Hermes `<tool_call>` blocks).

Run by tests/openai_client.rs: `python openai_client_tools.py BASE_URL`. A required or named tool
is forced by the server's grammar, so those calls are certain whatever the model; `auto` is the
model's choice, so only the answer's shape is checked. Each check prints one line; the first
failure raises and the process exits non-zero.
"""

import json
import sys

import openai

from openai_client_checks import check, expect_error

BASE = sys.argv[1].rstrip("/")
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = "pml"
WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def check_call(name, call, function=None):
    check(f"{name}: a function call with an id", call.type == "function" and call.id, call)
    if function:
        check(f"{name}: calls {function}", call.function.name == function, call)
    arguments = json.loads(call.function.arguments)
    check(f"{name}: arguments are a JSON object with a city",
          isinstance(arguments, dict) and isinstance(arguments.get("city"), str), arguments)


required = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                          tool_choice="required", max_tokens=80, temperature=0)
choice = required.choices[0]
check("required: finish reason tool_calls", choice.finish_reason == "tool_calls", choice)
check("required: at least one call", choice.message.tool_calls, choice.message)
for call in choice.message.tool_calls:
    check_call("required", call)
ids = [call.id for call in choice.message.tool_calls]
check("required: call ids are distinct", len(set(ids)) == len(ids), ids)

# The round trip: the assistant message goes back as the client returned it, then the result.
call = choice.message.tool_calls[0]
result = {"role": "tool", "tool_call_id": call.id, "content": "22 degrees Celsius, sunny"}
answer = client.chat.completions.create(model=MODEL, messages=ASK + [choice.message, result],
                                        tools=TOOLS, max_tokens=40, temperature=0)
reply = answer.choices[0]
check("round trip: the answer is text or another call",
      reply.message.content or reply.message.tool_calls, reply)
check("round trip: the prompt grew by the call and its result",
      answer.usage.prompt_tokens > required.usage.prompt_tokens + 10,
      (answer.usage, required.usage))
if reply.finish_reason == "stop":
    check("round trip: the answer uses the result", "22" in reply.message.content, reply.message)

named = {"type": "function", "function": {"name": "get_time"}}
stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named,
                                        parallel_tool_calls=False, max_tokens=80, temperature=0,
                                        stream=True, stream_options={"include_usage": True})
calls, finish, usage, text = {}, None, None, ""
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage
    for part in chunk.choices:
        finish = part.finish_reason or finish
        text += part.delta.content or ""
        for delta in part.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = delta.id or entry["id"]
            if delta.function:
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
check("named, streamed: one call", list(calls) == [0], calls)
check("named, streamed: finish reason tool_calls", finish == "tool_calls", finish)
check("named, streamed: the named function", calls[0]["name"] == "get_time", calls)
check("named, streamed: an id", bool(calls[0]["id"]), calls)
check("named, streamed: arguments parse",
      isinstance(json.loads(calls[0]["arguments"]).get("city"), str), calls)
check("named, streamed: no stray text", text.strip() == "", text)
check("named, streamed: usage", usage is not None and usage.completion_tokens > 0, usage)

auto = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80,
                                      temperature=0)
message = auto.choices[0].message
check("auto: text or calls", message.content or message.tool_calls, message)
for call in message.tool_calls or []:
    check("auto: a known function", call.function.name in ("get_weather", "get_time"), call)
    json.loads(call.function.arguments)
check("auto: finish reason fits",
      auto.choices[0].finish_reason == ("tool_calls" if message.tool_calls else "stop")
      or auto.choices[0].finish_reason == "length", auto.choices[0])

none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none",
                                      max_tokens=8, temperature=0)
check("none: text, no calls", none.choices[0].message.content and
      not none.choices[0].message.tool_calls, none.choices[0].message)

expect_error("a named tool that is not offered", 400, "tool_choice",
             lambda: client.chat.completions.create(
                 model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=2,
                 tool_choice={"type": "function", "function": {"name": "get_time"}}))
expect_error("required tools and response_format together", 400, "response_format",
             lambda: client.chat.completions.create(
                 model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=2,
                 response_format={"type": "json_object"}))
expect_error("a tool message without its call id", 400, "messages[1].tool_call_id",
             lambda: client.chat.completions.create(
                 model=MODEL, max_tokens=2,
                 messages=ASK + [{"role": "tool", "content": "22 degrees"}]))
expect_error("the deprecated functions API", 400, "functions",
             lambda: client.chat.completions.create(
                 model=MODEL, messages=ASK, max_tokens=2,
                 functions=[{"name": "f", "parameters": {"type": "object"}}]))

print(json.dumps({"passed": True}))
