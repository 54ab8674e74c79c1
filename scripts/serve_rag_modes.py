#!/usr/bin/env python3
"""The RAG workload of `serve_load_bench.py` through one `pml serve` in each way it can answer:
PML prompts in modes `full`, `reuse` and `blend`, and the same text as plain chat messages.
Reports each way's TTFT p50 / p95 under load and how often its whole answer (up to
`--max-tokens`, greedy) equals mode `full`'s for the same request: the fidelity a server pays
for reuse in any order, against what an exact computation of other tokens (the chat's template
text) gives.

Usage:
  scripts/serve_rag_modes.py --pml target/release/pml --model GGUF [--clients 8] [--requests 2]
      [--threads 2] [--max-tokens 32] [--recompute R]
"""
import argparse
import os
import shutil
import subprocess
import tempfile
import threading

import serve_load_bench as bench

PORT = 18210


def answers(port, kind, fields_extra, rag, clients, requests, max_tokens):
    """Every client's requests at once, `requests` each: {(client, index): (ttft, text)}."""
    results, errors = {}, []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client(number):
        barrier.wait()
        for index in range(requests):
            try:
                path, fields = bench.request(kind, number, index, rag)
                ttft, _, text, _ = bench.stream_request(port, path, dict(fields, **fields_extra),
                                                     max_tokens)
                with lock:
                    results[(number, index)] = (ttft, text)
            except Exception as error:  # reported, never silently dropped
                with lock:
                    errors.append(repr(error))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pml", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--recompute", type=float, default=None,
                        help="mode blend's fraction (default: the server's)")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="serve-rag-modes-")
    command = [args.pml, "serve", "--model", args.model, "--port", str(PORT),
               "--store", os.path.join(scratch, "store")]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    blend = {"mode": "blend"}
    if args.recompute is not None:
        blend["recompute"] = args.recompute
    ways = [("full", "pml", {"mode": "full"}), ("reuse", "pml", {"mode": "reuse"}),
            ("blend", "pml", blend), ("chat", "llama", {})]
    rag = bench.docqa()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env)
    rows = []
    try:
        bench.wait_ready(PORT, process)
        bench.upload_docqa(PORT, rag[0])
        reference = None
        for name, kind, extra in ways:
            load = open("/proc/loadavg").read().split()[0]
            results, errors = answers(PORT, kind, extra, rag, args.clients, args.requests,
                                      args.max_tokens)
            if errors:
                print(f"{name}: {len(errors)} failed requests, first: {errors[0]}")
            if reference is None:
                reference = results
            ttfts = [ttft for ttft, _ in results.values() if ttft is not None]
            same = sum(1 for key, (_, text) in results.items()
                       if key in reference and text == reference[key][1])
            rows.append((name, bench.percentile(ttfts, 0.5), bench.percentile(ttfts, 0.95),
                         same / max(1, len(results)), len(results), load))
    finally:
        process.terminate()
        process.wait(timeout=60)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"rag workload, one pml serve: {args.clients} clients x {args.requests} requests, "
          f"{args.threads} threads, max_tokens {args.max_tokens}")
    print(f"{'way':6} {'TTFT p50 s':>10} {'TTFT p95 s':>10} {'= full':>7} {'done':>5} {'load':>5}")
    for name, p50, p95, same, done, load in rows:
        print(f"{name:6} {p50:10.2f} {p95:10.2f} {same:7.2f} {done:5d} {load:>5}")


if __name__ == "__main__":
    main()
