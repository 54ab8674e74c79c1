"""The server as OpenAI's official Python client (`openai`) uses it, against a running `pml serve`.

Run by tests/openai_client.rs (which starts the server on the real default model, uploads the
`notes` schema of tests/support and passes the base URL): `python openai_client.py BASE_URL`.
Each check prints one line; the first failure raises and the process exits non-zero.
"""

import json
import sys

import openai

from openai_client_checks import check, expect_error

BASE = sys.argv[1].rstrip("/")
PML_PROMPT = sys.argv[2] if len(sys.argv) > 2 else None
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = "pml"
CHAT = [{"role": "user", "content": "Name one colour."}]


models = client.models.list()
check("models.list names the served model", [m.id for m in models.data] == [MODEL], models)
check("models.retrieve", client.models.retrieve(MODEL).id == MODEL)

chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5)
check("chat: one choice with text", len(chat.choices) == 1 and chat.choices[0].message.content)
check("chat: usage counts", chat.usage.completion_tokens <= 5 and chat.usage.prompt_tokens > 0)
check("chat: finish reason", chat.choices[0].finish_reason in ("stop", "length"))

limited = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=2)
check("max_completion_tokens bounds the answer", limited.usage.completion_tokens <= 2, limited.usage)

parts = client.chat.completions.create(
    model=MODEL,
    max_tokens=3,
    temperature=0,
    messages=[{"role": "user", "content": [
        {"type": "text", "text": "Name one "}, {"type": "text", "text": "colour."}]}],
)
plain = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0)
check("content parts are the joined text", parts.choices[0].message.content
      == plain.choices[0].message.content, (parts.choices[0].message, plain.choices[0].message))

two = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, n=2, temperature=0)
check("n=2 gives two choices", [c.index for c in two.choices] == [0, 1], two.choices)
check("n=2, greedy: the same answer twice",
      two.choices[0].message.content == two.choices[1].message.content == plain.choices[0].message.content,
      two.choices)
check("n=2 counts both answers' tokens",
      two.usage.completion_tokens == 2 * plain.usage.completion_tokens, (two.usage, plain.usage))
check("n=2 counts the prompt once", two.usage.prompt_tokens == plain.usage.prompt_tokens)

with_logprobs = client.chat.completions.create(
    model=MODEL, messages=CHAT, max_tokens=3, logprobs=True, top_logprobs=2, temperature=0)
content = with_logprobs.choices[0].logprobs.content
check("chat logprobs: one entry per token", len(content) == with_logprobs.usage.completion_tokens
      or with_logprobs.choices[0].finish_reason == "stop", content)
first = content[0]
check("chat logprobs: the greedy token is the likeliest", first.top_logprobs[0].token == first.token
      and abs(first.top_logprobs[0].logprob - first.logprob) < 1e-4, first)
check("chat logprobs: values are log-probabilities", all(e.logprob <= 0 for e in content))

text = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=3, logprobs=2)
lp = text.choices[0].logprobs
check("completions: text", isinstance(text.choices[0].text, str))
check("completions logprobs: parallel lists", len(lp.tokens) == len(lp.token_logprobs)
      == len(lp.top_logprobs) == len(lp.text_offset), lp)

stream = client.chat.completions.create(
    model=MODEL, messages=CHAT, max_tokens=4, stream=True, stream_options={"include_usage": True})
pieces, usage, finish = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
        check("stream: the usage chunk has no choices", chunk.choices == [], chunk)
    for choice in chunk.choices:
        pieces.append(choice.delta.content or "")
        finish = choice.finish_reason or finish
check("chat stream: text and a finish reason", "".join(pieces) and finish in ("stop", "length"))
check("chat stream: usage with include_usage", usage is not None and usage.completion_tokens <= 4)

stream = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=3, stream=True)
chunks = list(stream)
check("completions stream: no usage without include_usage", all(c.usage is None for c in chunks))
check("completions stream: text", "".join(c.choices[0].text for c in chunks if c.choices))

system = "You are a careful assistant. Answer in one short sentence, plainly. " * 12
prefixed = [{"role": "system", "content": system}, {"role": "user", "content": "Name one colour."}]
once = client.chat.completions.create(model=MODEL, messages=prefixed, max_tokens=6, temperature=0)
twice = client.chat.completions.create(model=MODEL, messages=prefixed, max_tokens=6, temperature=0)
cached = twice.usage.prompt_tokens_details.cached_tokens
check("prefix cache: a repeated chat is mostly spliced",
      cached >= 0.8 * twice.usage.prompt_tokens, twice.usage)
check("prefix cache: the same greedy answer as uncached",
      once.choices[0].message.content == twice.choices[0].message.content, (once, twice))

import jsonschema  # noqa: E402  (installed beside openai by scripts/setup-openai-client.sh)

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"], "additionalProperties": False}
structured = client.chat.completions.create(
    model=MODEL, max_tokens=40, temperature=0,
    messages=[{"role": "user", "content": "Invent a person: a name and an age."}],
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
answer = json.loads(structured.choices[0].message.content)
jsonschema.validate(answer, PERSON)
check("json_schema: the answer parses and validates", True, answer)
check("json_schema: it ended by itself", structured.choices[0].finish_reason == "stop",
      structured.choices[0])
loose = client.chat.completions.create(
    model=MODEL, max_tokens=40, temperature=0.8, seed=3,
    messages=[{"role": "user", "content": "Describe the sky."}],
    response_format={"type": "json_object"})
text = loose.choices[0].message.content
if loose.choices[0].finish_reason == "stop":
    check("json_object: an object", isinstance(json.loads(text), dict), text)
else:  # cut off by max_tokens: still the start of an object
    check("json_object: the start of an object", text.lstrip().startswith("{"), text)

if PML_PROMPT:
    pml = client.completions.create(model=MODEL, prompt=PML_PROMPT, max_tokens=3)
    details = pml.usage.prompt_tokens_details
    check("PML prompt: answered from the cached module", details.cached_tokens > 0, pml.usage)
    STATUS = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 30}},
              "required": ["answer"], "additionalProperties": False}
    pml_json = client.completions.create(
        model=MODEL, prompt=PML_PROMPT, max_tokens=30, temperature=0,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "status", "schema": STATUS}}})
    jsonschema.validate(json.loads(pml_json.choices[0].text), STATUS)
    check("PML prompt + json_schema: parses and validates", True, pml_json.choices[0].text)

expect_error("image part refused", 400, "messages[0].content[0].type",
             lambda: client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
                 {"role": "user", "content": [{"type": "image_url",
                                               "image_url": {"url": "https://x/y.png"}}]}]))
# Any model name is answered by the one model, so any id is found, its `root` the model's name.
other = client.models.retrieve("gpt-4o")
check("any model id is the served model's card", other.id == "gpt-4o"
      and getattr(other, "root", None) == MODEL, other)
body = expect_error("a prompt past the context", 400, None, lambda: client.completions.create(
    model=MODEL, prompt="word " * 40000, max_tokens=1))
check("a prompt past the context: code", body.get("code") == "context_length_exceeded", body)

print(json.dumps({"passed": True}))
