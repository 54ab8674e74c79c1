#!/usr/bin/env python3
"""Serving under load: `pml serve` against llama.cpp's `llama-server`, one after the other, same
GGUF, same machine, the same requests (the peer harness).

Usage:
  scripts/serve_load_bench.py --pml target/release/pml --llama-server PATH --model GGUF \
      [--clients 8] [--requests 2] [--threads 2] [--max-tokens 32] [--also-pml LABEL=PATH ...]

`--also-pml` runs another `pml` build on the same workload in the same run (a before/after
comparison beside the peer); `--also-pml "off=target/release/pml --speculative off"` the same
build with flags of its own. `--also-llama "LABEL=FLAGS"` runs `--llama-server` again with flags
of its own, for its speculative modes (`--also-llama "llama draft=-md DRAFT.gguf --spec-type
draft-simple --spec-draft-n-max 8"`: `-md` alone drafts nothing in llama.cpp of 0.3.36).

Workloads (`--workload`), each client sending its requests one after the other, all clients at
once, streaming, temperature 0:
- "chat": one shared ~700-token system prompt and a distinct question per request.
- "rag": 4 of the 10 documents of `schemas/docqa/docqa.pml` per request, in any order, and a
  question. `pml serve` gets the schema uploaded once and PML prompts importing the members (its
  collection; default mode); llama-server the same text as chat messages (system, the documents,
  the schema's assistant turn, the question).
- "mix": even clients send "rag" requests, odd ones "chat" requests: PML prompts beside plain
  chats in the same steps.
- "copy": an edit of schemas/codegen/src/utils.py (rename a parameter, return the whole file):
  answers copied from the prompt, where drafted tokens are accepted.
- "long": clients 0 and 1 send a ~3,000-token document to summarise, the others short questions;
  the short requests' TTFT is reported apart (a long prompt must not stall them).
`--repeat N` sends each request N times in a row: a question asked again, whose answer a server
drafts from its earlier one (`pml serve --draft-answers`).
llama-server runs with its defaults for prompt caching (`cache_prompt`) and `-np` = clients;
`pml serve` with its automatic prefix caching. Prints TTFT p50 / p95 (first streamed content)
output tokens/s (completion tokens over the workload's wall time) and TPOT p50 (vLLM's time per
output token: a request's time after its first token over the tokens after it, prefill left out)
for each, with `uptime`
and the CPU flags that matter beside them; for each `pml serve`, the most KV its sequences held
at once (`pml_kv_resident_peak_bytes`, every shared buffer counted once) and the forward passes
per engine step (`pml_forward_passes_total` / `pml_engine_steps_total`; builds without them: "-").
`--llama-server` may be left out to compare `pml` builds alone.
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import statistics
import tempfile
import subprocess
import threading
import time

import pml_metrics
from sse import chunks

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


DOCQA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schemas", "docqa",
                     "docqa.pml")
QUESTIONS = ["Which of these people directed horror films?", "Name a film from the documents.",
             "Which places are in Arkansas?", "Who starred in Ed Wood?",
             "What year was the earliest film released?", "Which documents mention Marvel?",
             "Were the directors of the same nationality?", "Summarise one document in a line."]
LONG = ("The committee reviewed the quarterly figures for the northern depots, noting delays in "
        "freight, staffing changes and the repairs scheduled for the loading bays. ") * 110


def docqa():
    """The docqa schema's text, its system and assistant text, and its members' texts."""
    schema = open(DOCQA).read()
    text = re.sub(r"<!--.*?-->", "", schema, flags=re.S)
    clean = lambda piece: " ".join(piece.split())
    members = {name: clean(body) for name, body in
               re.findall(r'<module name="([^"]+)">(.*?)</module>', text, flags=re.S)}
    system = clean(re.search(r"<system>(.*?)</system>", text, flags=re.S).group(1))
    assistant = clean(re.search(r"<assistant>(.*?)</assistant>", text, flags=re.S).group(1))
    return schema, system, assistant, members


def request(kind, client, index, rag):
    """What client `client` sends as its `index`-th request: (path, body fields) for each server
    kind ("pml" or "llama")."""
    if rag is not None:
        schema, system, assistant, members = rag
        picked = random.Random(client * 100 + index).sample(sorted(members), 4)
        asked = QUESTIONS[(client * 3 + index) % len(QUESTIONS)]
        if kind == "pml":
            imports = "".join(f"<{name}/>" for name in picked)
            return "/v1/completions", {
                "prompt": f'<prompt schema="docqa">{imports}<user>{asked}</user></prompt>'}
        documents = "\n".join(members[name] for name in picked)
        return "/v1/chat/completions", {"messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Here are the documents. Each begins with its title on "
                                        "its own line.\n" + documents},
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": asked}]}
    return "/v1/chat/completions", {"messages": [{"role": "system", "content": SYSTEM},
                                                 {"role": "user", "content": question(client, index)}]}


UTILS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schemas", "codegen", "src",
                     "utils.py")
RENAMES = [("position", "cell"), ("flags", "mask"), ("width", "columns"), ("value", "number")]


def copy_request(client, index):
    """An edit that returns a source file again: nearly every answer token is in the prompt."""
    old, new = RENAMES[(client + index) % len(RENAMES)]
    content = (f"Here is utils.py:\n```python\n{open(UTILS).read()}```\nRename the parameter "
               f"`{old}` to `{new}` in every function that takes it and update its uses. Return "
               "the complete new utils.py in one Python code block and nothing else.")
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": content}]}


def long_request(client, index):
    if client < 2:
        content = f"Document {client}-{index}. {LONG}\nSummarise the document in one sentence."
    else:
        content = question(client, index)
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": content}]}


def stream_request(port, path, fields, max_tokens):
    body = json.dumps(dict(fields, model="m", max_tokens=max_tokens, temperature=0, stream=True,
                           stream_options={"include_usage": True}))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    start = time.perf_counter()
    conn.request("POST", path, body.encode(), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    ttft, pieces, tokens, text = None, 0, None, []
    for chunk in chunks(response):
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or choice.get("text")
            if piece:
                pieces += 1
                text.append(piece)
                if ttft is None:
                    ttft = time.perf_counter() - start
        if chunk.get("usage"):
            tokens = chunk["usage"].get("completion_tokens")
    count = tokens if tokens is not None else pieces
    decode = time.perf_counter() - start - ttft if ttft is not None else 0.0
    tpot = decode / (count - 1) if count > 1 else None
    return ttft, count, "".join(text), tpot


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


def upload_docqa(port, schema):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/schemas", schema.encode(), {"Content-Type": "text/plain"})
    response = conn.getresponse()
    if response.status not in (200, 202):
        raise RuntimeError(f"upload: HTTP {response.status}: {response.read()[:300]!r}")
    response.read()
    deadline = time.time() + 600
    while time.time() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/v1/schemas/docqa")
        status = json.loads(conn.getresponse().read()).get("status")
        if status == "ready":
            return
        if status == "failed":
            raise RuntimeError("the docqa schema failed to compile")
        time.sleep(0.5)
    raise RuntimeError("the docqa schema did not compile in time")


def run_workload(port, kind, workload, clients, requests, max_tokens, repeat=1):
    """Every client's requests (each sent `repeat` times in a row); returns the TTFTs (the short requests' only in "long"), the
    completion tokens, the TPOTs, errors and wall time."""
    ttfts, tokens, tpots, errors = [], [], [], []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)
    rag = docqa() if workload in ("rag", "mix") else None
    if rag is not None and kind == "pml":
        upload_docqa(port, rag[0])

    def client(number):
        barrier.wait()
        for sent in range(requests * repeat):
            index = sent // repeat
            try:
                if workload == "long":
                    path, fields = long_request(number, index)
                elif workload == "copy":
                    path, fields = copy_request(number, index)
                else:
                    sends_rag = workload == "rag" or (workload == "mix" and number % 2 == 0)
                    path, fields = request(kind, number, index, rag if sends_rag else None)
                ttft, count, _, tpot = stream_request(port, path, fields, max_tokens)
                with lock:
                    if workload != "long" or number >= 2:
                        ttfts.append(ttft)
                    tokens.append(count)
                    if tpot is not None:
                        tpots.append(tpot)
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
    return ttfts, tokens, tpots, errors, wall


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pml", required=True)
    parser.add_argument("--llama-server")
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=1,
                        help="send each request this many times in a row (a question asked again)")
    parser.add_argument("--workload", choices=["chat", "rag", "mix", "long", "copy"], default="chat")
    parser.add_argument("--also-pml", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--also-llama", action="append", default=[], metavar="LABEL=FLAGS")
    args = parser.parse_args()
    if args.also_llama and not args.llama_server:
        parser.error("--also-llama needs --llama-server")
    servers = {}
    llamas = set()
    for offset, also in enumerate([""] + args.also_llama if args.llama_server else []):
        label, flags = also.split("=", 1) if also else ("llama-server", "")
        llamas.add(label)
        servers[label] = [
            args.llama_server, "-m", args.model, "--port", str(18201 - offset), "-t",
            str(args.threads), "-np", str(args.clients),
            "-c", str(args.clients * (4096 if args.workload == "long" else 2048))] + flags.split()
    servers["pml serve"] = [args.pml, "serve", "--model", args.model, "--port", "18202"]
    for offset, also in enumerate(args.also_pml):
        label, path = also.split("=", 1)
        # "LABEL=PATH --flag value": flags of that server's own (`--speculative off`).
        path, *flags = path.split()
        servers[label] = [path, "serve", "--model", args.model, "--port", str(18203 + offset)]
        servers[label] += flags
    # Each PML server on a store of its own: the uploaded schema is compiled afresh and
    # nothing is left in the user's store.
    scratch = tempfile.mkdtemp(prefix="serve-load-bench-")
    for name, command in servers.items():
        if name not in llamas:
            command += ["--store", os.path.join(scratch, str(len(command)) + name.replace(" ", "-"))]
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
            kind = "llama" if name in llamas else "pml"
            ttfts, tokens, tpots, errors, wall = run_workload(port, kind, args.workload, args.clients,
                                                       args.requests, args.max_tokens, args.repeat)
            kv_peak = pml_metrics.kv_peak_mib(port) if kind == "pml" else None
            per_step = pml_metrics.passes_per_step(port) if kind == "pml" else None
            drafts = pml_metrics.drafts(port) if kind == "pml" else None
        finally:
            process.terminate()
            process.wait(timeout=60)
        if errors:
            print(f"{name}: {len(errors)} failed requests, first: {errors[0]}")
        rows.append((name, percentile(ttfts, 0.5), percentile(ttfts, 0.95),
                     sum(tokens) / wall, percentile(tpots, 0.5) if tpots else None, len(ttfts),
                     load, kv_peak, per_step, drafts))
    shutil.rmtree(scratch, ignore_errors=True)
    short = " (TTFT of the short requests)" if args.workload == "long" else ""
    repeated = f" (each sent {args.repeat} times)" if args.repeat > 1 else ""
    print(f"{args.workload} workload{short}: {args.clients} clients x {args.requests} requests{repeated}, {args.threads} "
          f"threads each, max_tokens {args.max_tokens}; CPU: {simd}")
    print(f"{'server':14} {'TTFT p50 s':>10} {'TTFT p95 s':>10} {'out tok/s':>9} "
          f"{'TPOT p50 ms':>11} {'done':>5} {'load':>5} {'KV peak MiB':>11} {'passes/step':>11} "
          f"{'drafted/accepted':>16}")
    for name, p50, p95, rate, tpot, done, load, kv_peak, per_step, drafts in rows:
        peak = "-" if kv_peak is None else f"{kv_peak:.1f}"
        passes = "-" if per_step is None else f"{per_step:.3f}"
        per_token = "-" if tpot is None else f"{tpot * 1e3:.1f}"
        spec = "-" if drafts is None else f"{drafts[0]}/{drafts[1]}"
        if drafts is not None and drafts[2]:
            spec += f" (model {drafts[2]}/{drafts[3]})"
        print(f"{name:14} {p50:10.2f} {p95:10.2f} {rate:9.1f} {per_token:>11} {done:5d} {load:>5} "
              f"{peak:>11} {passes:>11} {spec:>16}")


if __name__ == "__main__":
    main()
