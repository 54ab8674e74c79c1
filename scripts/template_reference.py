#!/usr/bin/env python3
"""Renders llama.cpp's chat templates with Python's jinja2, as Hugging Face transformers does,
for a fixed set of conversations: the reference PML's minijinja rendering is tested against
(`crates/pml-compiler/tests/chat_templates_jinja2.rs`).

The environment is transformers' `_compile_jinja_template`: an ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loopcontrols extension, `tojson` as json.dumps
(ensure_ascii=False), `raise_exception` and `strftime_now` (fixed to one date here, so the
fixture is reproducible). Messages, tools, bos_token and eos_token are passed as transformers
passes them.

Usage (jinja2 from PyPI; the templates from scripts/fetch-llama-cpp-testdata.sh):

  python3 scripts/template_reference.py "$(bash scripts/fetch-llama-cpp-testdata.sh)/templates" \
      > tests/fixtures/reference/chat-templates-jinja2.json
"""

import datetime
import hashlib
import json
import sys
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The families PML runs: Llama 3.x (and its DeepSeek distill, Hermes tool use), Qwen2.5, Qwen3
# (and QwQ), Phi-3.5, SmolLM, Mistral, Gemma.
TEMPLATES = [
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen-QwQ-32B.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "google-gemma-2-2b-it.jinja",
]

DATE = datetime.datetime(2024, 7, 26)
BOS = "<|bos|>"
EOS = "<|eos|>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

CALL = {
    "id": "call_0123456789",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
}

CONVERSATIONS = {
    "user": {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    "system and user": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        "add_generation_prompt": True,
    },
    "multi-turn": {
        "messages": [
            {"role": "system", "content": "You answer in French."},
            {"role": "user", "content": "Hi, who are you?"},
            {"role": "assistant", "content": "Je suis un assistant."},
            {"role": "user", "content": "Quelle heure est-il ?\nMerci — 🙂"},
        ],
        "add_generation_prompt": True,
    },
    "ends with the answer": {
        "messages": [
            {"role": "user", "content": "Say yes."},
            {"role": "assistant", "content": "Yes."},
        ],
        "add_generation_prompt": False,
    },
    "tools": {
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "add_generation_prompt": True,
    },
    "tool round trip": {
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": CALL["id"], "name": "get_weather", "content": "22 degrees, sunny"},
        ],
        "tools": [WEATHER_TOOL],
        "add_generation_prompt": True,
    },
}


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return DATE.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    folder = Path(sys.argv[1])
    env = environment()
    out = {
        "renderer": f"jinja2 {jinja2.__version__}",
        "date": DATE.strftime("%Y-%m-%d"),
        "bos_token": BOS,
        "eos_token": EOS,
        "conversations": CONVERSATIONS,
        "templates": {},
    }
    for name in TEMPLATES:
        source = (folder / name).read_text(encoding="utf-8")
        template = env.from_string(source)
        cases = {}
        for conversation, spec in CONVERSATIONS.items():
            try:
                text = template.render(
                    messages=spec["messages"],
                    tools=spec.get("tools"),
                    add_generation_prompt=spec["add_generation_prompt"],
                    bos_token=BOS,
                    eos_token=EOS,
                )
                cases[conversation] = {"text": text}
            except Exception as error:  # the template refuses this conversation
                cases[conversation] = {"error": f"{type(error).__name__}: {error}"}
        out["templates"][name] = {
            "sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
            "cases": cases,
        }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
