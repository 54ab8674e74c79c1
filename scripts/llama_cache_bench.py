#!/usr/bin/env python3
"""The llama.cpp side of `pml bench cache --peer llama-cpp`: cached time to first token with the
document prefix's state held in RAM, as llama.cpp's server does with `cache_prompt`.

It loads a GGUF, prefills the whole prompt once (prefix and question, the reference without a
cache), then prefills the prefix alone and keeps its state in RAM. Then, for each line `round` read
on stdin, it answers the question from that state and prints one JSON line:

  {"event": "round", "ttft_s", "restore_s", "eval_s", "first_token",
   "wrapper_ttft_s", "wrapper_restore_s", "wrapper_first_token"}

`ttft_s` is restoring the prefix's state into the context (llama.cpp's `llama_state_set_data`,
from bytes kept in RAM), evaluating the question's tokens and taking the greedy first token.
`wrapper_ttft_s` is the same through llama-cpp-python's `Llama.load_state`, which also copies its
numpy logits buffers (n_batch x n_vocab floats), a cost of the Python wrapper rather than of
llama.cpp; both are reported, the first is the peer's figure. EOF on stdin ends the process.

Before the rounds it prints one line:

  {"event": "ready", "load_s", "prefix_tokens", "question_tokens", "full_ttft_s",
   "full_first_token", "prefix_prefill_s", "state_bytes", "threads"}

TOKENS.json is {"prefix": [ids...], "question": [ids...]}: the ids PML splices from its module
store and the ids it computes after them. Run inside the venv of scripts/setup-llama-cpp.sh:

  ~/.cache/pml/venv-llama-cpp/bin/python scripts/llama_cache_bench.py \\
      --model MODEL.gguf --tokens TOKENS.json --threads 2
"""

import argparse
import ctypes
import json
import sys
import time

import llama_cpp
import numpy as np


def greedy(llm):
    """The argmax of the logits of the last evaluated token."""
    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
    return int(np.argmax(logits))


def say(event, **fields):
    print(json.dumps({"event": event, **fields}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", required=True, help='JSON {"prefix": [...], "question": [...]}')
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    with open(args.tokens, encoding="utf-8") as file:
        tokens = json.load(file)
    prefix = [int(token) for token in tokens["prefix"]]
    question = [int(token) for token in tokens["question"]]
    if not prefix or not question:
        sys.exit(f"{args.tokens}: the prefix and the question need at least one token each")

    started = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=len(prefix) + len(question) + 16,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        # As llama.cpp's server (its default `--swa-full` is off): sliding-window layers keep only
        # their window, so the state to restore is smaller and the question attends over fewer
        # cells. llama-cpp-python's own default is the full-size cache.
        swa_full=False,
        verbose=False,
    )
    load_s = time.perf_counter() - started

    # The reference without a cache: the whole prompt in one prefill.
    started = time.perf_counter()
    llm.eval(prefix + question)
    full_first_token = greedy(llm)
    full_ttft_s = time.perf_counter() - started

    # The prefix alone, whose state is what a prompt cache keeps.
    llm.reset()
    started = time.perf_counter()
    llm.eval(prefix)
    prefix_prefill_s = time.perf_counter() - started
    wrapper_state = llm.save_state()
    ctx = llm._ctx.ctx
    state_bytes = llama_cpp.llama_state_get_size(ctx)
    state = (ctypes.c_uint8 * state_bytes)()
    state_bytes = llama_cpp.llama_state_get_data(ctx, state, state_bytes)
    say(
        "ready",
        load_s=load_s,
        prefix_tokens=len(prefix),
        question_tokens=len(question),
        full_ttft_s=full_ttft_s,
        full_first_token=full_first_token,
        prefix_prefill_s=prefix_prefill_s,
        state_bytes=int(state_bytes),
        threads=args.threads,
    )

    for line in sys.stdin:
        if line.strip() != "round":
            sys.exit(f"unknown request {line.strip()!r} (expected `round`)")
        # llama.cpp's own restore: one copy of the saved bytes into the KV cache.
        round_started = time.perf_counter()
        if llama_cpp.llama_state_set_data(ctx, state, state_bytes) != state_bytes:
            sys.exit("llama_state_set_data did not take the whole state")
        llm.n_tokens = len(prefix)
        restored = time.perf_counter()
        llm.eval(question)
        evaluated = time.perf_counter()
        first_token = greedy(llm)
        ttft_s = time.perf_counter() - round_started

        # The same through llama-cpp-python's wrapper.
        started = time.perf_counter()
        llm.load_state(wrapper_state)
        wrapper_restore_s = time.perf_counter() - started
        llm.eval(question)
        wrapper_first_token = greedy(llm)
        wrapper_ttft_s = time.perf_counter() - started
        say(
            "round",
            ttft_s=ttft_s,
            restore_s=restored - round_started,
            eval_s=evaluated - restored,
            first_token=first_token,
            wrapper_ttft_s=wrapper_ttft_s,
            wrapper_restore_s=wrapper_restore_s,
            wrapper_first_token=wrapper_first_token,
        )


if __name__ == "__main__":
    main()
