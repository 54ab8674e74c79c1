#!/usr/bin/env python3
"""The llama.cpp side of scripts/spec_decode_bench.py: greedy decode speed of the same prompt
tokens with llama-cpp-python, plain and with its own prompt lookup decoding
(`LlamaPromptLookupDecoding`, llama.cpp's n-gram drafting as llama-cpp-python ships it).

Reads JSON {"model": PATH, "threads": N, "max_tokens": N, "lookup": [N, ...],
"prompts": [{"name": ..., "tokens": [...]}]} on stdin and prints one JSON line per prompt and
configuration: {"prompt", "config" ("plain" or "lookup-N"), "tokens": [...],
"decode_steps", "decode_s"}. Decode time runs from the first generated token to the last
(the prompt's evaluation and the first token excluded, as PML's decode figure).

Run it inside the venv scripts/setup-llama-cpp.sh makes.
"""

import json
import sys
import time

import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding


def stop_tokens(llm):
    stops = {llm.token_eos()}
    for text in (b"<|im_end|>", b"<|endoftext|>", b"<end_of_turn>", b"<|eot_id|>"):
        ids = llm.tokenize(text, add_bos=False, special=True)
        if len(ids) == 1:
            stops.add(ids[0])
    return stops


def decode(llm, tokens, max_tokens, stops):
    """Greedy tokens until a stop token or `max_tokens`, the decode steps after the first
    token (the one that chose the stop token included) and their seconds."""
    generated = []
    first_at = None
    steps = -1
    for token in llm.generate(
        tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
    ):
        steps += 1
        if first_at is None:
            first_at = time.perf_counter()
        if token in stops:
            break
        generated.append(token)
        if len(generated) >= max_tokens:
            break
    ended = time.perf_counter()
    return generated, max(steps, 0), (ended - first_at) if first_at else 0.0


def main():
    job = json.load(sys.stdin)
    common = dict(
        model_path=job["model"],
        n_ctx=job.get("n_ctx", 4096),
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        n_batch=512,
        verbose=False,
    )
    plain = llama_cpp.Llama(**common)
    stops = stop_tokens(plain)
    configs = [("plain", plain)]
    for n in job.get("lookup", []):
        speculative = llama_cpp.Llama(
            **common, logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=n)
        )
        configs.append((f"lookup-{n}", speculative))
    for prompt in job["prompts"]:
        for name, llm in configs:
            generated, steps, seconds = decode(llm, prompt["tokens"], job["max_tokens"], stops)
            print(
                json.dumps(
                    {
                        "prompt": prompt["name"],
                        "config": name,
                        "tokens": generated,
                        "decode_steps": steps,
                        "decode_s": seconds,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
