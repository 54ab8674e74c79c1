#!/usr/bin/env python3
"""The PyTorch-eager side of `pml bench engine --device cuda` (scripts/gpu-check.sh runs it on
the GPU machine): loads the same GGUF through transformers (which dequantizes it), prefills
the same token ids `pml bench engine` uses (1000 + (i * 7919) % 20000), picks the first token
greedily and decodes more with the KV cache, timing each phase with the GPU synchronised.
Prints one JSON line per size and round:

  {"engine": "torch", "dtype", "tokens", "round", "load_s", "prefill_s", "decode_ms_per_token"}

  python3 scripts/torch_engine_bench.py --model MODEL.gguf --sizes 512,2048 --rounds 3

Needs torch, transformers and the `gguf` package (carried as a wheel to the GPU machine).
"""

import argparse
import json
import os
import time

import torch
from transformers import AutoModelForCausalLM


def bench_tokens(n):
    return [1000 + (i * 7919) % 20000 for i in range(n)]


def timed(fn):
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--sizes", default="512,2048,4096")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    folder, name = os.path.split(os.path.abspath(args.model))
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).to("cuda").eval()
    torch.cuda.synchronize()
    load_s = time.perf_counter() - started

    for round_index in range(args.rounds):
        for size in [int(size) for size in args.sizes.split(",")]:
            ids = torch.tensor([bench_tokens(size)], device="cuda")
            with torch.inference_mode():
                out, prefill_s = timed(lambda: model(input_ids=ids, use_cache=True))
                past = out.past_key_values
                token = out.logits[:, -1:].argmax(-1)

                def decode():
                    nonlocal past, token
                    for _ in range(args.decode):
                        step = model(input_ids=token, past_key_values=past, use_cache=True)
                        past = step.past_key_values
                        token = step.logits[:, -1:].argmax(-1)

                _, decode_s = timed(decode)
            print(json.dumps({
                "engine": "torch",
                "dtype": args.dtype,
                "tokens": size,
                "round": round_index,
                "load_s": round(load_s, 4),
                "prefill_s": round(prefill_s, 5),
                "decode_ms_per_token": round(1000 * decode_s / max(args.decode, 1), 3),
            }), flush=True)


if __name__ == "__main__":
    main()
