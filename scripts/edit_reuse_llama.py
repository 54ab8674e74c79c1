"""llama.cpp's `--cache-reuse` on the edited-fact set, the same tokens PML ran.

`pml eval DATA --edits --prompts-out PROMPTS.jsonl` writes each edited question's original and
edited prompt token ids. This script starts llama-server (one slot, 2 threads, the same GGUF)
twice: with `--cache-reuse 16` (KV shifting: chunks of at least 16 cached tokens that reappear
after an edit are moved, nothing recomputed), and with the prompt cache off (every token
computed: its `full`). Per question it sends the original prompt (cached, `n_predict` 1), then
the edited one, and takes the edited prompt's first greedy token and llama.cpp's own prompt time
(`timings.prompt_ms`, `prompt_n` tokens computed). Prints each question and the summary: the
first token's agreement with llama.cpp's full, and the median prompt-time ratio.

    python3 scripts/edit_reuse_llama.py LLAMA_SERVER MODEL.gguf PROMPTS.jsonl [PORT]
"""

import json
import statistics
import sys

import local_server

SERVER, MODEL, PROMPTS = sys.argv[1], sys.argv[2], sys.argv[3]
PORT = int(sys.argv[4]) if len(sys.argv) > 4 else 8191
questions = [json.loads(line) for line in open(PROMPTS, encoding="utf-8") if line.strip()]


def post(path, body):
    return local_server.post(PORT, path, body)


def start(extra):
    context = max(len(q["original"]) + len(q["edited"]) for q in questions) + 64
    return local_server.start(
        [SERVER, "-m", MODEL, "--port", str(PORT), "-t", "2", "-tb", "2", "-np", "1",
         "-c", str(context), "--temp", "0", *extra],
        PORT, "llama-server")


def first_token(tokens, cache):
    reply = post("/completion", {"prompt": tokens, "n_predict": 1, "temperature": 0,
                                 "cache_prompt": cache, "n_probs": 1})
    probs = reply.get("completion_probabilities") or []
    token = probs[0].get("id") if probs else None
    if token is None:
        token = reply["content"]
    timings = reply["timings"]
    return token, timings["prompt_ms"], timings["prompt_n"], timings.get("cache_n", 0)


def run(extra, cache):
    process = start(extra)
    try:
        results = {}
        for question in questions:
            if cache:
                first_token(question["original"], True)
            results[question["id"]] = first_token(question["edited"], cache)
        return results
    finally:
        process.terminate()
        process.wait()


full = run(["--no-cache-prompt"], False)
reuse = run(["--cache-reuse", "16"], True)
agree, ratios, computed = 0, [], []
for question in questions:
    (f_token, f_ms, f_n, _), (r_token, r_ms, r_n, r_cached) = (
        full[question["id"]], reuse[question["id"]])
    agree += f_token == r_token
    ratios.append(r_ms / f_ms)
    computed.append(r_n / f_n)
    print(f"{question['id']}: full {f_n} tokens {f_ms:.0f} ms, cache-reuse reused {r_cached} and "
          f"computed {r_n} in {r_ms:.0f} ms ({r_ms / f_ms:.3f}x), first token "
          f"{'=' if f_token == r_token else '≠'}")
print(f"median computed share: {statistics.median(computed):.3f}")
print(f"llama.cpp --cache-reuse 16 on {len(questions)} edited prompts: first token = its full's "
      f"in {agree / len(questions):.3f}; prompt time / full (median) "
      f"{statistics.median(ratios):.3f}")
