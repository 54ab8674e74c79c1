"""`pml serve`'s edit reuse on the edited-fact set, against its own prefix-only reuse and full.

`pml eval DATA --edits --prompts-out PROMPTS.jsonl` writes each edited question's original and
edited prompt token ids. The server takes text, so each prompt is detokenized by the server
itself (`/detokenize`) and sent as a plain completion prompt. The server is started three times
(one process, its default of 2 threads, the default model): with edit reuse (the default), with
`--no-edit-reuse` (the prefix cache reuses the blocks before the first change: `prefix`), and
with `--prefix-cache-mib 0` (every token computed: `full`). Per question the original prompt is
sent first (cached; skipped for `full`), then the edited one, `max_tokens` 1 at temperature 0;
the edited request's time on the client and its `usage` are recorded. Prints each question and
the summary: the first token's agreement with `full` and the median time ratio to `full`.

    python3 scripts/edit_reuse_server.py PML_BINARY PROMPTS.jsonl [LIMIT] [PORT]
"""

import json
import statistics
import sys
import time

import local_server

BINARY, PROMPTS = sys.argv[1], sys.argv[2]
LIMIT = int(sys.argv[3]) if len(sys.argv) > 3 else 30
PORT = int(sys.argv[4]) if len(sys.argv) > 4 else 8291
questions = [json.loads(line) for line in open(PROMPTS, encoding="utf-8") if line.strip()]
questions = questions[:LIMIT]
port = PORT


def post(path, body):
    return local_server.post(port, path, body)


def start(extra):
    return local_server.start([BINARY, "serve", "--port", str(port), *extra], port, "pml serve")


def complete(text):
    started = time.perf_counter()
    reply = post("/v1/completions", {"prompt": text, "max_tokens": 1, "temperature": 0})
    return reply["choices"][0]["text"], time.perf_counter() - started, reply["usage"]


def run(extra, send_original):
    # Each server its own port: the last one's may linger.
    global port
    port += 1
    process = start(extra)
    try:
        texts = [(post("/detokenize", {"tokens": q["original"]})["prompt"],
                  post("/detokenize", {"tokens": q["edited"]})["prompt"]) for q in questions]
        results = []
        for original, edited in texts:
            if send_original:
                complete(original)
            results.append(complete(edited))
        return results
    finally:
        process.terminate()
        process.wait()


full = run(["--prefix-cache-mib", "0"], send_original=False)
modes = {"edit": run([], True), "prefix": run(["--no-edit-reuse"], True)}
print("question\tmode\tfirst token agrees\ttime s\ttime / full\treused\trecomputed\tnew")
for name, results in modes.items():
    for index, ((text, seconds, usage), (full_text, full_seconds, _)) in enumerate(zip(results, full)):
        print(f"{index}\t{name}\t{text == full_text}\t{seconds:.3f}\t{seconds / full_seconds:.3f}\t"
              f"{usage['cached_tokens']}\t{usage['recomputed_tokens']}\t{usage['new_tokens']}")
for name, results in modes.items():
    agree = sum(text == full_text for (text, _, _), (full_text, _, _) in zip(results, full))
    ratio = statistics.median(seconds / full_seconds
                              for (_, seconds, _), (_, full_seconds, _) in zip(results, full))
    print(f"{name}: first token agrees with full on {agree}/{len(full)}, "
          f"median time / full {ratio:.3f}, full median {statistics.median(f[1] for f in full):.2f} s")
