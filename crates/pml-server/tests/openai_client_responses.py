"""The Responses API (`/v1/responses`) as OpenAI's official Python client (`openai`) uses it,
against a running `pml serve` on the default model: text and item input, `instructions`,
streaming (raw events and the SDK's `responses.stream` helper, which rebuilds the response from
the events and fails on any it cannot place), a required function tool and its result sent back
through `previous_response_id`, `text.format` JSON Schema, and refusals.

Run by tests/openai_client.rs: `python openai_client_responses.py BASE_URL`.
"""

import json
import sys

import openai

from openai_client_checks import check, expect_error

BASE = sys.argv[1].rstrip("/")
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = "pml"
WEATHER = {"type": "function", "name": "get_weather",
           "description": "The current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}

plain = client.responses.create(model=MODEL, input="Name one colour.",
                                instructions="Answer in one word.", max_output_tokens=8)
check("text input: completed", plain.status == "completed", plain)
check("text input: output_text", plain.output_text.strip(), plain.output)
check("text input: one message item", [item.type for item in plain.output] == ["message"],
      plain.output)
check("text input: usage", plain.usage.input_tokens > 0 and 0 < plain.usage.output_tokens <= 8,
      plain.usage)

items = client.responses.create(model=MODEL, max_output_tokens=8,
                                instructions="Answer in one word.", input=[
    {"role": "user", "content": [{"type": "input_text", "text": "Name one colour."}]}])
check("item input: the same (greedy) answer as text input",
      items.output_text == plain.output_text, (items.output_text, plain.output_text))

cut = client.responses.create(model=MODEL, input="Count from one to fifty in words.",
                              max_output_tokens=3)
check("max_output_tokens: incomplete", cut.status == "incomplete", cut)
check("max_output_tokens: the reason", cut.incomplete_details.reason == "max_output_tokens", cut)

events = list(client.responses.create(model=MODEL, input="Name one colour.",
                                      instructions="Answer in one word.", max_output_tokens=8,
                                      stream=True))
kinds = [event.type for event in events]
check("stream: created first, completed last",
      kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds)
check("stream: sequence numbers count up",
      [event.sequence_number for event in events] == list(range(len(events))), kinds)
deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
check("stream: deltas make the non-streamed text", deltas == plain.output_text,
      (deltas, plain.output_text))
check("stream: the final response holds the text",
      events[-1].response.output_text == plain.output_text, events[-1])

with client.responses.stream(model=MODEL, input="Name one colour.",
                             instructions="Answer in one word.", max_output_tokens=8) as stream:
    for _ in stream:
        pass
    final = stream.get_final_response()
check("stream helper: rebuilds the response", final.output_text == plain.output_text, final)

called = client.responses.create(model=MODEL, input="What is the weather in Paris?",
                                 tools=[WEATHER], tool_choice="required", max_output_tokens=60)
calls = [item for item in called.output if item.type == "function_call"]
check("required tool: a function_call item", calls and calls[0].name == "get_weather",
      called.output)
check("required tool: arguments parse",
      isinstance(json.loads(calls[0].arguments).get("city"), str), calls[0])
answer = client.responses.create(model=MODEL, previous_response_id=called.id, tools=[WEATHER],
                                 max_output_tokens=40, input=[
                                     {"type": "function_call_output", "call_id": calls[0].call_id,
                                      "output": "22 degrees Celsius, sunny"}])
check("tool result: answered", answer.status in ("completed", "incomplete") and answer.output,
      answer)
check("tool result: the earlier turn is in the prompt",
      answer.usage.input_tokens > called.usage.input_tokens + 10, (answer.usage, called.usage))

streamed_call = list(client.responses.create(
    model=MODEL, input="What is the weather in Oslo?", tools=[WEATHER],
    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60, stream=True))
arguments = "".join(event.delta for event in streamed_call
                    if event.type == "response.function_call_arguments.delta")
check("streamed tool call: arguments arrive as deltas",
      isinstance(json.loads(arguments).get("city"), str), arguments)

first = client.responses.create(model=MODEL, max_output_tokens=8,
                                input="My name is Ada. Reply with OK.")
second = client.responses.create(model=MODEL, previous_response_id=first.id,
                                 input="What is my name?", max_output_tokens=8)
check("previous_response_id: the earlier turn is in the prompt",
      second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens,
      (first.usage, second.usage))
check("previous_response_id: echoed", second.previous_response_id == first.id, second)
check("previous_response_id: the shared prefix is cached",
      second.usage.input_tokens_details.cached_tokens > 0, second.usage)

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}},
          "required": ["name"], "additionalProperties": False}
structured = client.responses.create(
    model=MODEL, input="Give a person's name as JSON.", max_output_tokens=30,
    text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
check("text.format json_schema: parses",
      isinstance(json.loads(structured.output_text).get("name"), str), structured.output_text)

expect_error("an unknown previous response", 400, "previous_response_id",
             lambda: client.responses.create(model=MODEL, input="hi",
                                             previous_response_id="resp_nosuch"))
expect_error("reasoning options", 400, "reasoning",
             lambda: client.responses.create(model=MODEL, input="hi",
                                             reasoning={"effort": "high"}))
expect_error("a hosted tool", 400, "tools[0].type",
             lambda: client.responses.create(model=MODEL, input="hi",
                                             tools=[{"type": "web_search"}]))

print(json.dumps({"passed": True}))
