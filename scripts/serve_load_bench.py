#!/usr/bin/env python3
"""Serving under load: `pml serve` against llama.cpp's `llama-server`, one after the other, same
GGUF, same machine, the same requests (issue #33's peer harness).

Usage:
  scripts/serve_load_bench.py --pml target/release/pml --llama-server PATH --model GGUF \
      [--clients 8] [--requests 2] [--threads 2] [--max-tokens 32] [--also-pml LABEL=PATH ...]

`--also-pml` runs another `pml` build on the same workload in the same run (a before/after
comparison beside the peer).

Workload "chat": one shared ~700-token system prompt and a distinct question per request, each
client sending its requests one after the other, all clients at once, streaming, temperature 0.
llama-server runs with its defaults for prompt caching (`cache_prompt`) and `-np` = clients;
`pml serve` with its automatic prefix caching. Prints TTFT p50 / p95 (first streamed content)
and output tokens/s (completion tokens over the workload's wall time) for each, with `uptime`
and the CPU flags that matter beside them.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import threading
import time

SYSTEM = ("You are the support assistant of a regional rail operator. Answer questions about "
          "timetables, tickets, refunds, accessibility and luggage briefly and politely. "
          "Tickets bought online can be refunded up to one hour before departure; season tickets "
          "are refunded pro rata. Bicycles travel free outside peak hours. Assistance for "
          "passengers with reduced mobility is booked at least two hours ahead. ") * 6
TOPICS = ["a refund", "a bicycle", "a delayed train", "a lost bag", "a season ticket",
          "wheelchair help", "a group booking", "a night train", "a pet", "a missed connection",
          "a child fare", "a seat reservation", "a strike day", "an airport train", "luggage size",
          "a wrong ticket"]


def question(client, index):
    return f"Client {client}, request {index}: what should I do about {TOPICS[(client * 7 + index) % len(TOPICS)]}?"


def stream_chat(port, content, max_tokens):
    body = json.dumps({"model": "m", "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": content}]})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    ttft, chunks, tokens = None, 0, None
    for raw in response:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
        if chunk.get("usage"):
            tokens = chunk["usage"].get("completion_tokens")
    return ttft, tokens if tokens is not None else chunks


def wait_ready(port, process, seconds=600):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server on {port} exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server on {port} not ready in {seconds} s")


def run_workload(port, clients, requests, max_tokens):
    ttfts, tokens, errors = [], [], []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client(number):
        barrier.wait()
        for index in range(requests):
            try:
                ttft, count = stream_chat(port, question(number, index), max_tokens)
                with lock:
                    ttfts.append(ttft)
                    tokens.append(count)
            except Exception as error:  # reported below, never silently dropped
                with lock:
                    errors.append(repr(error))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    return ttfts, tokens, errors, wall


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pml", required=True)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--also-pml", action="append", default=[], metavar="LABEL=PATH")
    args = parser.parse_args()
    servers = {
        "llama-server": [args.llama_server, "-m", args.model, "--port", "18201", "-t",
                         str(args.threads), "-np", str(args.clients),
                         "-c", str(args.clients * 2048)],
        "pml serve": [args.pml, "serve", "--model", args.model, "--port", "18202"],
    }
    for offset, also in enumerate(args.also_pml):
        label, path = also.split("=", 1)
        servers[label] = [path, "serve", "--model", args.model, "--port", str(18203 + offset)]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
    simd = " ".join(f for f in flags if f.startswith(("avx512", "avx2", "avx_vnni", "amx")))
    rows = []
    for name, command in servers.items():
        port = int(command[command.index("--port") + 1])
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=env)
        try:
            wait_ready(port, process)
            load = open("/proc/loadavg").read().split()[0]
            ttfts, tokens, errors, wall = run_workload(port, args.clients, args.requests,
                                                       args.max_tokens)
        finally:
            process.terminate()
            process.wait(timeout=60)
        if errors:
            print(f"{name}: {len(errors)} failed requests, first: {errors[0]}")
        rows.append((name, percentile(ttfts, 0.5), percentile(ttfts, 0.95),
                     sum(tokens) / wall, len(ttfts), load))
    print(f"chat workload: {args.clients} clients x {args.requests} requests, {args.threads} "
          f"threads each, max_tokens {args.max_tokens}; CPU: {simd}")
    print(f"{'server':14} {'TTFT p50 s':>10} {'TTFT p95 s':>10} {'out tok/s':>9} {'done':>5} {'load':>5}")
    for name, p50, p95, rate, done, load in rows:
        print(f"{name:14} {p50:10.2f} {p95:10.2f} {rate:9.1f} {done:5d} {load:>5}")


if __name__ == "__main__":
    main()
