"""Automatic prefix caching, measured with OpenAI's official client against a running `pml serve`.

Each round builds a fresh system prompt of at least MIN_CHARS characters (~750+ tokens) from the
development set's system prompts (a different slice per round, so nothing is cached before), then
sends two chats with it: a first question, then another. Both are streamed with
`stream_options.include_usage`; TTFT is the time to the first content chunk. Prints each round and
the medians: the second chat's TTFT over the first's, and its cached share of the prompt.

    python scripts/prefix_cache_bench.py http://127.0.0.1:8080 [ROUNDS]
(with the venv of scripts/setup-openai-client.sh)
"""

import csv
import os
import statistics
import sys
import time

import openai

BASE = sys.argv[1].rstrip("/")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
MIN_CHARS = 3200
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "eval", "system-prompts.csv")

csv.field_size_limit(10**8)
prompts = [row[1] for row in list(csv.reader(open(DATA, encoding="utf-8")))[1:] if len(row) > 1]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)


def system_prompt(start):
    parts, size, index = [], 0, start
    while size < MIN_CHARS:
        parts.append(prompts[index % len(prompts)])
        size += len(parts[-1])
        index += 1
    return "\n\n".join(parts), index


def ask(system, question):
    began = time.perf_counter()
    ttft, usage = None, None
    stream = client.chat.completions.create(
        model="pml", max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - began
        if chunk.usage is not None:
            usage = chunk.usage
    return ttft, usage


ratios, shares, next_start = [], [], 0
for round_index in range(ROUNDS):
    system, next_start = system_prompt(next_start)
    first, first_usage = ask(system, "What is the first thing you would do?")
    second, usage = ask(system, "Summarise your role in five words.")
    cached = usage.prompt_tokens_details.cached_tokens
    ratios.append(second / first)
    shares.append(cached / usage.prompt_tokens)
    print(f"round {round_index + 1}: system prompt {first_usage.prompt_tokens} tokens; first TTFT "
          f"{first * 1000:.0f} ms (cached {first_usage.prompt_tokens_details.cached_tokens}), "
          f"second TTFT {second * 1000:.0f} ms, cached {cached} of {usage.prompt_tokens} "
          f"({cached / usage.prompt_tokens:.0%}): {second / first:.3f}x")
print(f"median second/first TTFT: {statistics.median(ratios):.3f}x; "
      f"median cached share of the second prompt: {statistics.median(shares):.0%}")
