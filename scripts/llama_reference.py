#!/usr/bin/env python3
"""Writes reference fixtures for one GGUF model using llama.cpp (llama-cpp-python).

PML's Rust tokenizers and forward passes are checked against an independent
implementation; this script produces that implementation's answers:

  tokenizer-<id>.json  token ids for a few hundred strings (add_bos=False, special=False)
  logits-<id>.json     prompt token ids and the top-10 [id, logit] pairs at every position

Run it inside the venv made by scripts/setup-llama-cpp.sh:

  ~/.cache/pml/venv-llama-cpp/bin/python scripts/llama_reference.py \
      --model-id qwen2.5-0.5b --out tests/fixtures/reference/

Output is deterministic: fixed strings, a seeded generator, fixed thread count, and
top-k ties broken by token id.
"""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import llama_cpp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_texts  # noqa: E402

# The pinned GGUF files (design.md §5). A different file would make the fixtures
# describe some other model, so a mismatch is an error unless explicitly allowed.
MODELS = {
    "qwen2.5-0.5b": {
        "name_hint": "qwen",
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    "gemma3-270m": {
        "name_hint": "gemma",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    "smollm2-135m": {
        "name_hint": "smollm",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
}

TOP_K = 10
N_THREADS = 2
LOGIT_DECIMALS = 4


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_model(model_id):
    """The single .gguf under $PML_HOME/models whose name contains the model's hint."""
    models_dir = Path(os.environ.get("PML_HOME", Path.home() / ".cache" / "pml")) / "models"
    hint = MODELS[model_id]["name_hint"]
    matches = sorted(p for p in models_dir.glob("*.gguf") if hint in p.name.lower())
    if len(matches) != 1:
        sys.exit(f"expected exactly one *{hint}*.gguf in {models_dir}, found {[str(m) for m in matches]}")
    return matches[0]


def tokenize(llm, text, add_bos, special):
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)


def tokenizer_fixture(model_path, header):
    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    cases = []
    for text in reference_texts.tokenizer_cases():
        ids = tokenize(llm, text, add_bos=False, special=False)
        cases.append({"text": text, "ids": [int(i) for i in ids]})
    return {**header, "options": {"add_bos": False, "special": False}, "cases": cases}


def top_k(row):
    """Top-k (id, logit) pairs, highest logit first, ties broken by the lower id."""
    ids = np.lexsort((np.arange(row.shape[0]), -row))[:TOP_K]
    return [[int(i), round(float(row[i]), LOGIT_DECIMALS)] for i in ids]


def logits_fixture(model_path, model_id, header):
    prompts = reference_texts.logits_prompts(model_id)
    llm = None
    cases = []
    for name, text, parse_special in prompts:
        if llm is None:
            llm = llama_cpp.Llama(
                model_path=str(model_path),
                logits_all=True,
                n_ctx=1024,
                n_batch=1024,
                n_threads=N_THREADS,
                n_threads_batch=N_THREADS,
                seed=0,
                verbose=False,
            )
        # add_bos=True lets llama.cpp decide from the GGUF's add_bos_token, as llama-cli would.
        ids = tokenize(llm, text, add_bos=True, special=parse_special)
        llm.reset()
        llm.eval(ids)
        scores = np.asarray(llm.scores[: llm.n_tokens], dtype=np.float32)
        cases.append(
            {
                "name": name,
                "text": text,
                "parse_special": parse_special,
                "ids": [int(i) for i in ids],
                "positions": [{"top": top_k(row)} for row in scores],
            }
        )
    return {**header, "options": {"n_ctx": 1024, "n_batch": 1024, "n_threads": N_THREADS}, "cases": cases}


def write_json(path, data):
    """Compact JSON with one case per line, so a regenerated fixture diffs case by case."""
    compact = {"ensure_ascii": False, "separators": (",", ":")}
    header = {key: value for key, value in data.items() if key != "cases"}
    lines = [json.dumps(header, **compact)[:-1] + ',"cases":[']
    lines.append(",\n".join(json.dumps(case, **compact) for case in data["cases"]))
    lines.append("]}")
    text = "\n".join(lines) + "\n"
    if json.loads(text) != data:
        sys.exit(f"{path}: JSON round trip changed the data")
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(data['cases'])} cases)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", required=True, choices=sorted(MODELS))
    parser.add_argument("--model", type=Path, help="GGUF path (default: found under $PML_HOME/models)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--allow-other-sha", action="store_true", help="accept a GGUF that is not the pinned file")
    args = parser.parse_args()

    model_path = args.model or find_model(args.model_id)
    digest = sha256_of(model_path)
    if digest != MODELS[args.model_id]["sha256"] and not args.allow_other_sha:
        sys.exit(f"{model_path}: sha256 {digest} is not the pinned {MODELS[args.model_id]['sha256']}")
    header = {
        "model": args.model_id,
        "gguf_sha256": digest,
        "tool": f"llama-cpp-python {llama_cpp.__version__}",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"tokenizer-{args.model_id}.json", tokenizer_fixture(model_path, header))
    write_json(args.out / f"logits-{args.model_id}.json", logits_fixture(model_path, args.model_id, header))


if __name__ == "__main__":
    main()
