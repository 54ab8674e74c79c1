#!/usr/bin/env python3
"""One llama.cpp measurement for `pml bench engine`: loads a GGUF, prefills the given
token ids, picks the first token greedily, decodes a few more, and prints one JSON line:

  {"load_s", "prefill_s", "ttft_s", "decode_ms_per_token", "peak_rss_bytes"}

`pml bench engine` runs it once per prompt size in a fresh process (so the peak resident
memory is that configuration's), inside the venv made by scripts/setup-llama-cpp.sh:

  ~/.cache/pml/venv-llama-cpp/bin/python scripts/llama_engine_bench.py \
      --model MODEL.gguf --tokens TOKENS.json --decode 32 --threads 2

TOKENS.json is a JSON array of token ids (the same ids PML's engine is timed on).
"""

import argparse
import json
import time

import llama_cpp
import numpy as np


def peak_rss_bytes():
    """VmHWM of this process, as PML reads it for its own engine."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def greedy(llm):
    """The argmax of the logits of the last evaluated token."""
    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
    return int(np.argmax(logits))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", required=True, help="JSON array of token ids to prefill")
    parser.add_argument("--decode", type=int, default=32, help="tokens decoded after the prefill")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    with open(args.tokens, encoding="utf-8") as file:
        tokens = [int(token) for token in json.load(file)]
    started = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=len(tokens) + args.decode + 16,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    load_s = time.perf_counter() - started

    started = time.perf_counter()
    llm.eval(tokens)
    prefill_s = time.perf_counter() - started
    token = greedy(llm)
    ttft_s = time.perf_counter() - started

    started = time.perf_counter()
    for _ in range(args.decode):
        llm.eval([token])
        token = greedy(llm)
    decode_s = time.perf_counter() - started

    print(
        json.dumps(
            {
                "load_s": load_s,
                "prefill_s": prefill_s,
                "ttft_s": ttft_s,
                "decode_ms_per_token": 1000.0 * decode_s / max(args.decode, 1),
                "peak_rss_bytes": peak_rss_bytes(),
            }
        )
    )


if __name__ == "__main__":
    main()
