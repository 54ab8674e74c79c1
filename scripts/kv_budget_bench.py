#!/usr/bin/env python3
"""Many long completions at once against a running `pml serve --kv-cache-mib N`: all must
finish, and the sequences' resident KV must stay within the budget (the
acceptance: 32 concurrent 3,000-token requests under a budget smaller than they need together).

Usage: scripts/kv_budget_bench.py PORT [CLIENTS] [PROMPT_WORDS] [MAX_TOKENS]

Every prompt opens differently, so no two share a prefix-cache block. Prints each request's
status, TTFT and total time, then the KV gauges of /metrics: budget, the peak resident bytes
(sampled by the engine at the end of every step) and what the requests would need together.
"""
import http.client
import json
import sys
import threading
import time

import pml_metrics
from sse import chunks

port = int(sys.argv[1])
clients = int(sys.argv[2]) if len(sys.argv) > 2 else 32
words = int(sys.argv[3]) if len(sys.argv) > 3 else 2300
max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 32
filler = ("The committee reviewed the quarterly figures for the northern depots, noting delays "
          "in freight, staffing changes and the repairs scheduled for the loading bays. ").split()


def ask(index, results, start):
    text = " ".join(filler[(index + i) % len(filler)] for i in range(words))
    body = json.dumps({"prompt": f"Report {index} of {clients}. {text}\nSummary:",
                       "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    start.wait()
    began = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    ttft, usage, error = None, None, None
    if response.status != 200:
        error = response.read().decode()
    else:
        for chunk in chunks(response):
            if "error" in chunk:
                error = chunk["error"]
            if ttft is None and chunk.get("choices"):
                ttft = time.perf_counter() - began
            if chunk.get("usage"):
                usage = chunk["usage"]
    results[index] = (response.status, ttft, time.perf_counter() - began, usage, error)


results = [None] * clients
start = threading.Barrier(clients)
threads = [threading.Thread(target=ask, args=(i, results, start)) for i in range(clients)]
began = time.perf_counter()
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
wall = time.perf_counter() - began
ok = 0
for index, (status, ttft, total, usage, error) in enumerate(results):
    done = status == 200 and error is None and usage is not None
    ok += done
    prompt = usage["prompt_tokens"] if usage else "-"
    print(f"request {index:2}: status {status}, prompt {prompt} tokens, "
          f"TTFT {ttft or 0:.1f} s, total {total:.1f} s{'' if done else f', error {error}'}")
gauges = pml_metrics.read(port, ("pml_kv_", "pml_requests_total"))
budget = gauges.get("pml_kv_pool_bytes", 0)
peak = gauges.get("pml_kv_resident_peak_bytes", 0)
prompt_tokens = sum(r[3]["prompt_tokens"] for r in results if r[3])
print(f"{ok}/{clients} finished in {wall:.0f} s; {prompt_tokens} prompt tokens in all")
if budget == 0:
    # The server was started without --kv-cache-mib: nothing to be within.
    print(f"no KV budget (pml serve without --kv-cache-mib), peak resident {peak / 2**20:.1f} MiB")
else:
    print(f"KV budget {budget / 2**20:.0f} MiB, peak resident {peak / 2**20:.1f} MiB "
          f"({'within' if peak <= budget else 'OVER'} the budget)")
print(json.dumps(gauges))
