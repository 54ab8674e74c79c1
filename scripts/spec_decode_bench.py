#!/usr/bin/env python3
"""Decode speed with and without speculation, PML against itself and llama.cpp, same run, same
machine, same tokens.

Runs `pml run PROMPT --json` for each model and workload, `--speculative off`, `ngram` and (with
`--draft MODEL=DRAFT`) `--draft-model DRAFT`, the order alternating by round, greedy; with
`--llama-python`, llama-cpp-python on the tokens PML's full prefill computes, plain and with
its `LlamaPromptLookupDecoding` (the best of `--lookup`'s lengths), 2 threads each. Reports
decode tokens/s (steps after the first token over their time), the ratios, the drafts'
acceptance, and whether each answer is plain PML's tokens (speculation's must be, up to near
ties; llama.cpp's may differ by rounding). Workloads:
  copy-heavy  an edit that returns an imported source file again (codegen/prompt-rename-parameter)
  docqa       questions over the docqa documents (short answers drawn from them)
  open chat   the roles schema's etymologist (no answer text in the prompt)

usage: scripts/spec_decode_bench.py [--pml target/release/pml] [--models qwen2.5-0.5b,qwen2.5-1.5b]
       [--rounds 2] [--max-tokens 256] [--draft qwen2.5-1.5b=qwen2.5-0.5b]
       [--llama-python ~/.cache/pml/venv-llama-cpp/bin/python] [--lookup 2,10]
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


def run(pml, model, prompt, speculative, max_tokens, extra=()):
    command = [
        pml, "run", prompt, "--model", model, "--json", "--max-tokens", str(max_tokens),
        "--speculative", speculative, "--color", "never", *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def model_path(pml, model):
    """The GGUF `pml models fetch` keeps `model` in (fetched first if absent)."""
    done = subprocess.run([pml, "models", "fetch", model], capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        if "ready at " in line:
            return line.split("ready at ", 1)[1].strip()
    sys.exit(f"pml models fetch {model}: no path in its output\n{done.stderr[-1000:]}")


def llama_round(python, pml, model, prompts, max_tokens, threads, lookup):
    """One pass of scripts/llama_decode_bench.py over `prompts`, fed the tokens PML's full
    prefill computes for each: {(prompt, config): result}."""
    job = {
        "model": model_path(pml, model),
        "threads": threads,
        "max_tokens": max_tokens,
        "lookup": lookup,
        "prompts": [
            {
                "name": prompt,
                "tokens": run(pml, model, prompt, "off", 1, ["--mode", "full"])["prompt_token_ids"],
            }
            for prompt in prompts
        ],
    }
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_decode_bench.py")
    done = subprocess.run([python, script], input=json.dumps(job), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"llama_decode_bench.py failed:\n{done.stderr[-2000:]}")
    results = {}
    for line in done.stdout.splitlines():
        result = json.loads(line)
        results[(result["prompt"], result["config"])] = result
    return results


class Arm:
    """Decode steps, seconds, drafts and answers of one configuration over a workload."""

    def __init__(self):
        self.steps = 0
        self.seconds = 0.0
        self.drafted = 0
        self.accepted = 0
        self.same = 0
        self.answers = 0

    def add(self, steps, seconds, same, drafted=0, accepted=0):
        self.steps += steps
        self.seconds += seconds
        self.same += same
        self.answers += 1
        self.drafted += drafted
        self.accepted += accepted

    def rate(self):
        return self.steps / self.seconds if self.seconds else float("nan")


def add_pml(arm, result, plain_ids):
    steps = max(result["tokens_generated"] - 1, 0)
    seconds = (result["decode_ms_per_token"] or 0.0) * steps / 1e3
    arm.add(steps, seconds, result["token_ids"] == plain_ids,
            result["tokens_drafted"], result["tokens_accepted"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pml", default="target/release/pml")
    parser.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--draft", action="append", default=[], metavar="MODEL=DRAFT",
                        help="also run MODEL with --draft-model DRAFT (repeatable)")
    parser.add_argument("--llama-python", metavar="PYTHON",
                        help="the venv python of scripts/setup-llama-cpp.sh: adds llama.cpp "
                             "plain and its prompt lookup decoding on the same tokens")
    parser.add_argument("--lookup", default="2,10",
                        help="llama-cpp-python's num_pred_tokens to try (its best is reported)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    drafts = dict(pair.split("=", 1) for pair in args.draft)
    lookup = [int(n) for n in args.lookup.split(",") if n]

    print(f"# {cpu_line()}")
    print(f"# load: {open('/proc/loadavg').read().split()[:3]}")
    columns = ["plain", "ngram", "draft", "llama.cpp", "llama.cpp lookup"]
    print("| model | workload | answers | " + " | ".join(f"{c} tok/s" for c in columns)
          + " | ngram / plain | draft / plain | best PML / llama.cpp | best PML / best llama.cpp "
          "| ngram accepted | draft accepted | same tokens (ngram, draft, llama.cpp) |")
    print("|" + "---|" * (3 + len(columns) + 7))
    for model in args.models.split(","):
        draft = drafts.get(model)
        for workload, prompts in WORKLOADS.items():
            arms = {name: Arm() for name in ["off", "ngram", "draft", "llama", "lookup"]}
            lookup_arms = {n: Arm() for n in lookup}
            for round_index in range(args.rounds):
                llama = (
                    llama_round(args.llama_python, args.pml, model, prompts, args.max_tokens,
                                args.threads, lookup)
                    if args.llama_python else {}
                )
                for prompt in prompts:
                    order = ["off", "ngram"] + (["draft"] if draft else [])
                    if round_index % 2:
                        order.reverse()
                    results = {}
                    for name in order:
                        extra = ["--draft-model", draft] if name == "draft" else []
                        speculative = "off" if name == "off" else ("draft" if name == "draft" else "ngram")
                        results[name] = run(args.pml, model, prompt, speculative,
                                            args.max_tokens, extra)
                    plain_ids = results["off"]["token_ids"]
                    for name, result in results.items():
                        add_pml(arms[name], result, plain_ids)
                    if llama:
                        plain = llama[(prompt, "plain")]
                        arms["llama"].add(plain["decode_steps"], plain["decode_s"],
                                          plain["tokens"] == plain_ids)
                        for n in lookup:
                            got = llama[(prompt, f"lookup-{n}")]
                            lookup_arms[n].add(got["decode_steps"], got["decode_s"],
                                               got["tokens"] == plain_ids)
            if lookup_arms:
                arms["lookup"] = max(lookup_arms.values(), key=Arm.rate)
                best_lookup = max(lookup_arms, key=lambda n: lookup_arms[n].rate())
            rate = {name: arm.rate() for name, arm in arms.items()}
            best_pml = max(rate[name] for name in ["off", "ngram", "draft"] if arms[name].answers)
            best_llama = max(rate["llama"], rate["lookup"]) if llama else float("nan")

            def cell(name):
                return f"{rate[name]:.1f}" if arms[name].answers else "-"

            def accepted(name):
                arm = arms[name]
                if not arm.answers:
                    return "-"
                return f"{arm.accepted}/{arm.drafted} ({100 * arm.accepted / max(arm.drafted, 1):.0f}%)"

            same = ", ".join(
                f"{arms[name].same}/{arms[name].answers}" if arms[name].answers else "-"
                for name in ["ngram", "draft", "llama"]
            )
            lookup_cell = cell("lookup") + (f" (n={best_lookup})" if lookup_arms and llama else "")
            print(
                f"| {model} | {workload} | {arms['off'].answers} | {cell('off')} | {cell('ngram')} | "
                f"{cell('draft')} | {cell('llama')} | {lookup_cell} | "
                f"{rate['ngram'] / rate['off']:.2f}x | "
                + (f"{rate['draft'] / rate['off']:.2f}x" if arms["draft"].answers else "-")
                + f" | {best_pml / rate['llama']:.2f}x | {best_pml / best_llama:.2f}x | "
                f"{accepted('ngram')} | {accepted('draft')} | {same} |",
                flush=True,
            )
    print(f"# load after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
