#!/usr/bin/env python3
"""Decode speed with and without n-gram speculation, PML against itself, same run, same machine.

Runs `pml run PROMPT --json` for each model and workload, `--speculative off` and `ngram`
alternating first, greedy, and reports decode tokens/s, the ratio, the drafts' acceptance, and
whether the two answers are the same tokens (they must be, up to near ties). Workloads:
  copy-heavy  an edit that returns an imported source file again (codegen/prompt-rename-parameter)
  docqa       questions over the docqa documents (short answers drawn from them)
  open chat   the roles schema's etymologist (no answer text in the prompt)

usage: scripts/spec_decode_bench.py [--pml target/release/pml] [--models qwen2.5-0.5b,qwen2.5-1.5b]
       [--rounds 2] [--max-tokens 256]
"""

import argparse
import json
import os
import platform
import subprocess
import sys

WORKLOADS = {
    "copy-heavy": ["schemas/codegen/prompt-rename-parameter.pml"],
    "docqa": [
        "schemas/docqa/prompt-composer.pml",
        "schemas/docqa/prompt-nationality.pml",
        "schemas/docqa/prompt-cowriter.pml",
    ],
    "open chat": ["schemas/roles/prompt-etymologist.pml"],
}


def cpu_line():
    model = flags = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    simd = [f for f in flags if f.startswith("avx512") or f in ("avx2", "fma")]
    no512 = os.environ.get("PML_NO_AVX512") == "1"
    return f"{model} | {platform.machine()} | {' '.join(simd)}" + (" | PML_NO_AVX512=1" if no512 else "")


def run(pml, model, prompt, speculative, max_tokens):
    command = [
        pml, "run", prompt, "--model", model, "--json", "--max-tokens", str(max_tokens),
        "--speculative", speculative, "--color", "never",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pml", default="target/release/pml")
    parser.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()

    print(f"# {cpu_line()}")
    print(f"# load: {open('/proc/loadavg').read().split()[:3]}")
    print("| model | workload | answers | tokens | plain tok/s | ngram tok/s | ratio | drafted | accepted | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for workload, prompts in WORKLOADS.items():
            seconds = {"off": 0.0, "ngram": 0.0}
            tokens = {"off": 0, "ngram": 0}
            drafted = accepted = 0
            same = 0
            answers = 0
            for round_index in range(args.rounds):
                for prompt in prompts:
                    order = ["off", "ngram"] if round_index % 2 == 0 else ["ngram", "off"]
                    results = {}
                    for speculative in order:
                        result = run(args.pml, model, prompt, speculative, args.max_tokens)
                        results[speculative] = result
                        decoded = max(result["tokens_generated"] - 1, 0)
                        if result["decode_ms_per_token"] is not None:
                            seconds[speculative] += result["decode_ms_per_token"] * decoded / 1e3
                            tokens[speculative] += decoded
                    drafted += results["ngram"]["tokens_drafted"]
                    accepted += results["ngram"]["tokens_accepted"]
                    same += results["ngram"]["token_ids"] == results["off"]["token_ids"]
                    answers += 1
            plain = tokens["off"] / seconds["off"] if seconds["off"] else float("nan")
            ngram = tokens["ngram"] / seconds["ngram"] if seconds["ngram"] else float("nan")
            print(
                f"| {model} | {workload} | {answers} | {tokens['off'] // args.rounds} | {plain:.1f} | "
                f"{ngram:.1f} | {ngram / plain:.2f}x | {drafted} | {accepted} "
                f"({100 * accepted / max(drafted, 1):.0f}%) | {same}/{answers} |",
                flush=True,
            )
    print(f"# load after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
