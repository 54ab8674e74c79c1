#!/usr/bin/env python3
"""TTFT of `n=4` against `n=1` on a ~1000-token prompt through a running `pml serve`.

Usage: scripts/n_choices_bench.py PORT ROUNDS

Streams each request (time to the first chunk with text), alternating which `n` goes first in
each round; every prompt starts with a different opening, so nothing is spliced from the prefix
cache and each request computes its whole prompt. With the choices sharing one prefill, `n=4`
costs about what `n=1` does; with the choices reading the prompt's rows in place, the peak
resident KV (`pml_kv_resident_peak_bytes`, printed last) holds the prompt once.
"""
import http.client
import json
import random
import sys
import time

import pml_metrics
from sse import chunks

port, rounds = int(sys.argv[1]), int(sys.argv[2])
base = ("The committee reviewed the quarterly figures for the northern depots, noting delays in "
        "freight, staffing changes and the repairs scheduled for the loading bays. ") * 34


def ask(n, tag):
    body = json.dumps({"prompt": f"Report {tag}. " + base + "Summary:", "max_tokens": 8,
                       "n": n, "temperature": 0.8, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    ttft, usage = None, None
    for chunk in chunks(conn.getresponse()):
        if ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
            ttft = time.perf_counter() - start
        if chunk.get("usage"):
            usage = chunk["usage"]
    return ttft, time.perf_counter() - start, usage


results = {1: [], 4: []}
for r in range(rounds):
    for n in ([1, 4] if r % 2 == 0 else [4, 1]):
        ttft, total, usage = ask(n, f"{r}-{n}-{random.random()}")
        results[n].append(ttft)
        print(f"round {r} n={n}: TTFT {ttft * 1000:.0f} ms, total {total * 1000:.0f} ms, "
              f"prompt {usage['prompt_tokens']} tokens, new {usage['new_tokens']}, "
              f"shared {usage.get('shared_tokens')}", flush=True)


def median(values):
    return sorted(values)[len(values) // 2]


print(f"median TTFT n=1 {median(results[1]) * 1000:.0f} ms, n=4 {median(results[4]) * 1000:.0f} ms, "
      f"ratio {median(results[4]) / median(results[1]):.2f}; "
      f"peak resident KV {pml_metrics.kv_peak_mib(port):.1f} MiB")
