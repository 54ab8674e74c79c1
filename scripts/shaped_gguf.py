#!/usr/bin/env python3
"""Writes a GGUF with a real model's exact shapes and hyperparameters and random weights.

The files measure speed and memory at real sizes; what they answer is noise. Each
shape below is one published model's text decoder: its config.json numbers, written
under the metadata keys and tensor names that llama.cpp's convert_hf_to_gguf.py
(llama-cpp-python 0.3.36's vendored llama.cpp, with the transformers 4.57.6 that it
pins) writes for that architecture, and the tokenizer.* keys (vocabulary, merges,
special ids, chat template) copied from a small real GGUF with the same vocabulary.
Weights are N(0, 0.02) from numpy's default_rng(seed), written as F16 one chunk at a
time (norms 1.0 and biases 0 as F32, as the converter writes them); llama.cpp's own
quantizer then makes the Q4_K_M or Q8_0 file, and the F16 one is deleted.

Run it with the interpreter of the venv made by scripts/setup-llama-cpp.sh, which also
installs gguf-py (the version that llama-cpp-python 0.3.36's sdist vendors):

  PY=${PML_HOME:-~/.cache/pml}/venv-llama-cpp/bin/python
  $PY scripts/shaped_gguf.py --shape qwen2.5-7b --quant q4_k_m
      # -> ~/.cache/pml/shaped/qwen2.5-7b-q4_k_m.gguf
  $PY scripts/shaped_gguf.py --shape qwen2.5-1.5b --out /tmp/shaped/q.gguf \\
      --compare ~/.cache/pml/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --check-load

Disk: the F16 intermediate is 2 bytes a parameter (a 7B is ~15 GB) and sits next to
the output until quantized. Memory: the writer holds one 16M-element chunk of weights
(~0.5 GiB peak, mostly the copied vocabulary); llama.cpp's quantizer then peaks at a few
times the largest tensor (3.6 GiB for qwen2.5-7b, 4.4 GiB for gemma-3-4b's 262144-row
embedding). On two busy cores a 7B takes ~2 min to write and 6-8 min to quantize to Q4_K_M.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("shaped_gguf.py needs gguf-py: run `python -m pip install gguf==0.19.0` with this interpreter")

PML_HOME = Path(os.environ.get("PML_HOME", Path.home() / ".cache" / "pml"))

# GGUFs whose tokenizer.* keys are copied, relative to PML_HOME.
QWEN_VOCAB = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
LLAMA3_VOCAB = "llama-cpp-testdata/0.3.36/models/ggml-vocab-llama-bpe.gguf"
LLAMA_SPM_VOCAB = "llama-cpp-testdata/0.3.36/models/ggml-vocab-llama-spm.gguf"
GEMMA3_VOCAB = "models/gemma-3-270m-q4_k_m.gguf"


@dataclass(frozen=True)
class Shape:
    """One model's text decoder, as its config.json (plus transformers' defaults) gives it."""

    hf_repo: str  # where the numbers come from
    arch: str  # llama.cpp architecture (general.architecture)
    n_embd: int  # hidden_size
    n_layer: int  # num_hidden_layers
    n_head: int  # num_attention_heads
    n_head_kv: int  # num_key_value_heads
    n_ff: int  # intermediate_size
    n_vocab: int  # rows of token_embd.weight
    n_ctx: int  # max_position_embeddings
    rope_theta: float
    rms_eps: float  # rms_norm_eps
    tied_embeddings: bool  # tie_word_embeddings: no output.weight
    vocab_source: str  # GGUF whose tokenizer.* keys are copied, relative to PML_HOME
    head_dim: int | None = None  # only where the converter sees one (written as key/value_length)
    rope_scaling: dict | None = field(default=None, hash=False)
    rope_theta_swa: float | None = None  # rope_local_base_freq
    sliding_window: int | None = None

    @property
    def n_embd_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


SHAPES: dict[str, Shape] = {
    # Qwen's own GGUF releases of tied models also carry output.weight: --untie-embeddings.
    "qwen2.5-1.5b": Shape(
        "Qwen/Qwen2.5-1.5B-Instruct", "qwen2", n_embd=1536, n_layer=28, n_head=12, n_head_kv=2,
        n_ff=8960, n_vocab=151936, n_ctx=32768, rope_theta=1e6, rms_eps=1e-6,
        tied_embeddings=True, vocab_source=QWEN_VOCAB),
    "qwen2.5-7b": Shape(
        "Qwen/Qwen2.5-7B-Instruct", "qwen2", n_embd=3584, n_layer=28, n_head=28, n_head_kv=4,
        n_ff=18944, n_vocab=152064, n_ctx=32768, rope_theta=1e6, rms_eps=1e-6,
        tied_embeddings=False, vocab_source=QWEN_VOCAB),
    # LlamaConfig fills in head_dim (hidden_size / heads), so the converter writes key_length.
    "llama-3.1-8b": Shape(
        "meta-llama/Llama-3.1-8B-Instruct", "llama", n_embd=4096, n_layer=32, n_head=32, n_head_kv=8,
        n_ff=14336, n_vocab=128256, n_ctx=131072, rope_theta=500000.0, rms_eps=1e-5,
        tied_embeddings=False, vocab_source=LLAMA3_VOCAB, head_dim=128,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # sliding_window 4096 is in its config, but the converter's llama path does not write it.
    "mistral-7b": Shape(
        "mistralai/Mistral-7B-v0.1", "llama", n_embd=4096, n_layer=32, n_head=32, n_head_kv=8,
        n_ff=14336, n_vocab=32000, n_ctx=32768, rope_theta=10000.0, rms_eps=1e-5,
        tied_embeddings=False, vocab_source=LLAMA_SPM_VOCAB),
    # text_config with Gemma3TextConfig's defaults; config's vocab_size 262208 counts image
    # tokens, and the converter keeps only the tokenizer's 262144 rows. rope_scaling (linear 8)
    # applies to the global layers; every 6th layer global is llama.cpp's gemma3 default.
    "gemma-3-4b": Shape(
        "google/gemma-3-4b-it", "gemma3", n_embd=2560, n_layer=34, n_head=8, n_head_kv=4,
        n_ff=10240, n_vocab=262144, n_ctx=131072, rope_theta=1e6, rms_eps=1e-6,
        tied_embeddings=True, vocab_source=GEMMA3_VOCAB, head_dim=256,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_theta_swa=10000.0,
        sliding_window=1024),
}


@dataclass(frozen=True)
class Block:
    """What an architecture's decoder block has beyond the plain llama block."""

    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # post_attention_norm and post_ffw_norm (Gemma's sandwich norms)


BLOCKS = {"llama": Block(), "qwen2": Block(qkv_bias=True), "gemma3": Block(qk_norm=True, post_norms=True)}

QUANTS = {
    "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
}

WEIGHT_STD = 0.02
CHUNK_ELEMENTS = 1 << 24  # 64 MiB of float32 per generated chunk


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order, (rows, cols); GGUF stores it reversed
    fixed: np.ndarray | None = None  # small F32 tensors (norms, biases, rope factors); None: random F16

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


class RandomF16:
    """Stands in for the array that GGUFWriter.write_tensor_data writes (it reads only
    `nbytes` and calls `tofile`): N(0, std) values generated and written in chunks, so a
    2 GB embedding never sits in memory."""

    def __init__(self, n_elements: int, rng: np.random.Generator, std: float):
        self.n_elements = n_elements
        self.nbytes = 2 * n_elements
        self.rng = rng
        self.std = std

    def tofile(self, fout) -> None:
        chunk_f32 = np.empty(min(CHUNK_ELEMENTS, self.n_elements), dtype=np.float32)
        chunk_f16 = np.empty(chunk_f32.size, dtype=np.float16)
        for start in range(0, self.n_elements, CHUNK_ELEMENTS):
            n = min(CHUNK_ELEMENTS, self.n_elements - start)
            self.rng.standard_normal(out=chunk_f32[:n], dtype=np.float32)
            chunk_f32[:n] *= self.std
            chunk_f16[:n] = chunk_f32[:n]
            chunk_f16[:n].tofile(fout)


def tensor_name(kind: gguf.MODEL_TENSOR, suffix: str, layer: int | None = None) -> str:
    return gguf.TENSOR_NAMES[kind].format(bid=layer) + suffix


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """rope_freqs.weight as LlamaModel.generate_extra_tensors computes it for rope_type llama3."""
    scaling = shape.rope_scaling
    dim = shape.n_embd_head
    freqs = 1.0 / (np.float32(shape.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    old_context = scaling["original_max_position_embeddings"]
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    wavelen = 2 * np.pi / freqs
    smooth = (old_context / wavelen - low) / (high - low)
    factors = np.where(wavelen < old_context / high, 1.0,
                       np.where(wavelen > old_context / low, factor, 1 / ((1 - smooth) / factor + smooth)))
    return factors.astype(np.float32)


def tensor_specs(shape: Shape) -> list[TensorSpec]:
    """Every tensor the converter writes for this shape, in a fixed order."""
    T = gguf.MODEL_TENSOR
    block = BLOCKS[shape.arch]
    n_q = shape.n_head * shape.n_embd_head
    n_kv = shape.n_head_kv * shape.n_embd_head

    def norm(kind, width, layer=None):
        return TensorSpec(tensor_name(kind, ".weight", layer), (width,), np.ones(width, dtype=np.float32))

    def bias(kind, width, layer):
        return TensorSpec(tensor_name(kind, ".bias", layer), (width,), np.zeros(width, dtype=np.float32))

    def weight(kind, rows, cols, layer=None):
        return TensorSpec(tensor_name(kind, ".weight", layer), (rows, cols))

    specs = [weight(T.TOKEN_EMBD, shape.n_vocab, shape.n_embd)]
    for i in range(shape.n_layer):
        specs.append(norm(T.ATTN_NORM, shape.n_embd, i))
        for kind, rows in ((T.ATTN_Q, n_q), (T.ATTN_K, n_kv), (T.ATTN_V, n_kv)):
            specs.append(weight(kind, rows, shape.n_embd, i))
            if block.qkv_bias:
                specs.append(bias(kind, rows, i))
        if block.qk_norm:
            specs += [norm(T.ATTN_Q_NORM, shape.n_embd_head, i), norm(T.ATTN_K_NORM, shape.n_embd_head, i)]
        specs.append(weight(T.ATTN_OUT, shape.n_embd, n_q, i))
        if block.post_norms:
            specs.append(norm(T.ATTN_POST_NORM, shape.n_embd, i))
        specs += [norm(T.FFN_NORM, shape.n_embd, i),
                  weight(T.FFN_GATE, shape.n_ff, shape.n_embd, i),
                  weight(T.FFN_UP, shape.n_ff, shape.n_embd, i),
                  weight(T.FFN_DOWN, shape.n_embd, shape.n_ff, i)]
        if block.post_norms:
            specs.append(norm(T.FFN_POST_NORM, shape.n_embd, i))
    specs.append(norm(T.OUTPUT_NORM, shape.n_embd))
    if not shape.tied_embeddings:
        specs.append(weight(T.OUTPUT, shape.n_vocab, shape.n_embd))
    if shape.rope_scaling and shape.rope_scaling["rope_type"] == "llama3":
        factors = llama3_rope_factors(shape)
        specs.append(TensorSpec(tensor_name(T.ROPE_FREQS, ".weight"), factors.shape, factors))
    return specs


def check_names_known(shape: Shape, specs: list[TensorSpec]) -> None:
    """Every name must be one that gguf-py lists for the architecture (catches a typo in a kind)."""
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == shape.arch)
    known = {gguf.TENSOR_NAMES[kind].format(bid=i) for kind in gguf.MODEL_TENSORS[arch] for i in range(shape.n_layer)}
    unknown = [s.name for s in specs if s.name.rsplit(".", 1)[0] not in known]
    if unknown:
        raise ValueError(f"{shape.arch} has no tensors {unknown}")


def write_general(writer: gguf.GGUFWriter, shape_id: str, shape: Shape, seed: int, n_params: int) -> None:
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(f"{shape_id} shaped, random weights")
    writer.add_description(f"Shapes and hyperparameters of {shape.hf_repo}; weights N(0, {WEIGHT_STD}) "
                           f"from numpy default_rng({seed}): outputs are noise (scripts/shaped_gguf.py)")
    writer.add_size_label(gguf.size_label(n_params, 0, 0, 0))


def write_hyperparameters(writer: gguf.GGUFWriter, shape: Shape) -> None:
    """The keys TextModel.set_gguf_parameters and the architecture's subclass write, in their order."""
    writer.add_block_count(shape.n_layer)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    if shape.rope_scaling and shape.rope_scaling["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(shape.rope_scaling["factor"])
    writer.add_rope_freq_base(shape.rope_theta)
    if shape.rope_theta_swa is not None:
        writer.add_rope_freq_base_swa(shape.rope_theta_swa)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    if shape.head_dim is not None:
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if shape.arch == "llama":
        writer.add_vocab_size(shape.n_vocab)
        writer.add_rope_dimension_count(shape.n_embd_head)
    if shape.sliding_window is not None:
        writer.add_sliding_window(shape.sliding_window)


def field_value(field: gguf.ReaderField):
    """A metadata value as GGUFWriter takes it back; strings stay bytes, exactly as stored."""
    main_type = field.types[0]
    if main_type == gguf.GGUFValueType.STRING:
        return field.parts[field.data[0]].tobytes()
    if main_type == gguf.GGUFValueType.ARRAY and field.types[-1] == gguf.GGUFValueType.STRING:
        return [field.parts[i].tobytes() for i in field.data]
    return field.contents()


def padded_vocab(key: str, values: list, n_vocab: int, tokenizer_model: str) -> list:
    """Per-token arrays grown to n_vocab the converter's way: BPE vocabularies name a
    missing id `[PAD<id>]`, SentencePiece ones `[PAD1]`, `[PAD2]`, ...; type UNUSED, score -1000."""
    missing_ids = range(len(values), n_vocab)
    if key == gguf.Keys.Tokenizer.LIST:
        if tokenizer_model == "gpt2":
            return values + [f"[PAD{i}]".encode() for i in missing_ids]
        return values + [f"[PAD{n + 1}]".encode() for n in range(len(missing_ids))]
    if key == gguf.Keys.Tokenizer.TOKEN_TYPE:
        return values + [gguf.TokenType.UNUSED] * len(missing_ids)
    return values + [-1000.0] * len(missing_ids)  # scores


def copy_tokenizer(writer: gguf.GGUFWriter, source: Path, n_vocab: int) -> None:
    """Every tokenizer.* key of `source`, with its stored type; per-token arrays padded to n_vocab."""
    per_token = {gguf.Keys.Tokenizer.LIST, gguf.Keys.Tokenizer.TOKEN_TYPE, gguf.Keys.Tokenizer.SCORES}
    fields = {key: f for key, f in gguf.GGUFReader(source).fields.items() if key.startswith("tokenizer.")}
    n_tokens = len(fields[gguf.Keys.Tokenizer.LIST].data)
    if n_tokens > n_vocab:
        raise ValueError(f"{source} has {n_tokens} tokens, more than the {n_vocab} embedding rows")
    tokenizer_model = field_value(fields[gguf.Keys.Tokenizer.MODEL]).decode()
    for key, f in fields.items():
        value = field_value(f)
        if key in per_token:
            value = padded_vocab(key, value, n_vocab, tokenizer_model)
        sub_type = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, f.types[0], sub_type=sub_type)
    print(f"tokenizer: {len(fields)} keys from {source.name}, {n_tokens} tokens"
          + (f" padded to {n_vocab}" if n_tokens < n_vocab else ""))


def write_f16(shape_id: str, shape: Shape, path: Path, seed: int) -> None:
    specs = tensor_specs(shape)
    check_names_known(shape, specs)
    n_params = sum(s.n_elements for s in specs)
    writer = gguf.GGUFWriter(path, shape.arch)
    write_general(writer, shape_id, shape, seed, n_params)
    write_hyperparameters(writer, shape)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    copy_tokenizer(writer, PML_HOME / shape.vocab_source, shape.n_vocab)
    for spec in specs:
        dtype = np.float32 if spec.fixed is not None else np.float16
        writer.add_tensor_info(spec.name, spec.shape, np.dtype(dtype), spec.n_elements * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for spec in specs:
        writer.write_tensor_data(spec.fixed if spec.fixed is not None else RandomF16(spec.n_elements, rng, WEIGHT_STD))
    writer.close()
    print(f"wrote {path}: {len(specs)} tensors, {n_params / 1e9:.2f}B parameters, {path.stat().st_size / 2**30:.2f} GiB")


def quantize(f16_path: Path, out_path: Path, ftype: int, n_threads: int) -> None:
    """llama.cpp's quantizer (llama-quantize's library call) with its default mix for `ftype`."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = n_threads
    status = llama_cpp.llama_model_quantize(str(f16_path).encode(), str(out_path).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama_model_quantize returned {status}")


def check_load(path: Path, n_threads: int, verbose: bool) -> None:
    """Load with llama.cpp, prefill a few tokens and decode three greedily; prints what it saw."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=n_threads, verbose=verbose)
    desc = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(llm.model, desc, len(desc))
    print(f"llama.cpp: {desc.value.decode()}, {llama_cpp.llama_model_n_params(llm.model) / 1e9:.2f}B params, "
          f"{llama_cpp.llama_model_size(llm.model) / 2**30:.2f} GiB, n_vocab {llm.n_vocab()}, "
          f"n_ctx_train {llama_cpp.llama_model_n_ctx_train(llm.model)}")
    ids = llm.tokenize(b"The quick brown fox jumps over the lazy dog.", add_bos=True)
    started = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - started
    generated = []
    started = time.perf_counter()
    for _ in range(3):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        if not np.isfinite(logits).all():
            raise RuntimeError("non-finite logits")
        generated.append(int(np.argmax(logits)))
        llm.eval([generated[-1]])
    decode_s = (time.perf_counter() - started) / 3
    print(f"llama.cpp: prefill {len(ids)} tokens {prefill_s * 1000:.0f} ms, decode {decode_s * 1000:.0f} ms/token, "
          f"greedy ids {generated} ({llm.detokenize(generated)!r})")


def compare(ours: Path, real: Path) -> None:
    """Tensor names, shapes and types and every metadata key and value but the general.* names
    (architecture, file type and quantization version are compared), ours vs a real GGUF."""
    compared_general = {gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE,
                        gguf.Keys.General.QUANTIZATION_VERSION}

    def is_name_key(key: str) -> bool:
        return key.startswith("general.") and key not in compared_general

    readers = gguf.GGUFReader(ours), gguf.GGUFReader(real)
    tensors = [{t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name) for t in r.tensors} for r in readers]
    metadata = [{k: (tuple(t.name for t in f.types), field_value(f)) for k, f in r.fields.items()
                 if not k.startswith("GGUF.") and not is_name_key(k)} for r in readers]
    general = [sorted(k for k in r.fields if is_name_key(k)) for r in readers]
    differences = 0
    for label, (a, b) in (("tensor", tensors), ("metadata", metadata)):
        for key in sorted(a.keys() | b.keys()):
            if a.get(key) != b.get(key):
                differences += 1
                show = [repr(v)[:120] if v is not None else "absent" for v in (a.get(key), b.get(key))]
                print(f"differs: {label} {key}: ours {show[0]}, real {show[1]}")
    print(f"compare: {len(tensors[0])} vs {len(tensors[1])} tensors, {len(metadata[0])} vs {len(metadata[1])} "
          f"keys, {differences} differences; not compared: ours {general[0]}, real {general[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="shapes: " + ", ".join(f"{k} ({v.hf_repo})" for k, v in SHAPES.items()))
    parser.add_argument("--shape", required=True, choices=SHAPES)
    parser.add_argument("--quant", default="q4_k_m", choices=QUANTS)
    parser.add_argument("--out", type=Path, help="default: $PML_HOME/shaped/<shape>-<quant>.gguf")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="quantizer and load-check threads (default 2)")
    parser.add_argument("--untie-embeddings", action="store_true",
                        help="write output.weight even where the model ties it, as Qwen's own GGUF releases do")
    parser.add_argument("--keep-f16", action="store_true", help="keep the F16 intermediate (<out>.f16.gguf)")
    parser.add_argument("--compare", type=Path, metavar="REAL_GGUF",
                        help="then list tensor and metadata differences against a real GGUF of this shape")
    parser.add_argument("--check-load", action="store_true",
                        help="then load the result with llama.cpp and evaluate a few tokens")
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp's log when loading")
    args = parser.parse_args()

    shape = replace(SHAPES[args.shape], tied_embeddings=False) if args.untie_embeddings else SHAPES[args.shape]
    out = args.out or PML_HOME / "shaped" / f"{args.shape}-{args.quant}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    ftype = QUANTS[args.quant]
    f16_path = out if ftype == gguf.LlamaFileType.MOSTLY_F16 else out.with_suffix(".f16.gguf")

    started = time.perf_counter()
    write_f16(args.shape, shape, f16_path, args.seed)
    print(f"time: write F16 {time.perf_counter() - started:.1f} s")
    if f16_path != out:
        started = time.perf_counter()
        quantize(f16_path, out, ftype, args.threads)
        print(f"time: quantize {args.quant} {time.perf_counter() - started:.1f} s; "
              f"{out} {out.stat().st_size / 2**30:.2f} GiB")
        if not args.keep_f16:
            f16_path.unlink()
    print(f"peak RSS so far: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    if args.compare:
        compare(out, args.compare)
    if args.check_load:
        check_load(out, args.threads, args.verbose)


if __name__ == "__main__":
    main()
