#!/usr/bin/env bash
# The GPU runbook: build here, carry, run there.
#
#   scripts/gpu-check.sh build        # here: release `pml` and the GPU test binaries, --features cuda
#   scripts/gpu-check.sh pack [GGUF]  # here: .gpu/call-N/ folders of at most 56 MiB (a call carries 64 with the tree) holding the
#                                     #   binaries (stripped, gzip) and the GGUF (default:
#                                     #   SmolLM2-135M's) in pieces
#   scripts/gpu-check.sh stash DIR    # there: keep a carried call-N folder for the next call only
#   scripts/gpu-check.sh device DIR   # there (the GPU machine), once per call-N folder carried:
#                                     #   stash it, reassemble what has arrived, run the GPU tests
#                                     #   (PML_DEVICE=cuda PML_REQUIRE_GPU=1) and, once the model
#                                     #   is whole, the benchmarks
#
# The GPU machines have the NVIDIA driver, PyTorch (with its CUDA 13 libraries) and no cargo or
# registry, and a call carries at most 64 MiB: so everything is built here, the binaries are
# compressed, and a model larger than one call travels over several calls (`device` reassembles
# whatever pieces have arrived in .gpu/ and in $GPU_STASH, where each call leaves its pieces).
#
# Linking without CUDA libraries: candle enables cudarc's `dynamic-linking`, so the binary is
# linked against libcuda, libcublas, libcublasLt, libcurand and libnvrtc. This machine has no
# driver and none of those libraries, and the wheels of the last four are ~1 GB; instead `build`
# writes stub libraries that define every function cudarc declares (their names read from
# cudarc's own bindings) under the SONAMEs the real ones have (libcuda.so.1, CUDA 13's
# libcublas.so.13, ...). The binary records those SONAMEs and the dynamic loader binds them to
# the driver's and PyTorch's real libraries on the GPU machine (`device` puts PyTorch's on
# LD_LIBRARY_PATH). Nothing from the stubs is ever executed. The CUDA runtime (libcudart.so.13,
# which candle-kernels' MoE kernels use) is the toolkit wheel's real one.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${PML_CUDA_TARGET:-target/cuda}"
STUBS="$TARGET_DIR/stubs"
GPU_DIR=.gpu
GPU_STASH="${GPU_STASH:-/root/pml-gpu}"
PIECE_MIB=8
CALL_MIB=58

log() { printf '[gpu-check] %s\n' "$*"; }
die() {
    printf '[gpu-check] error: %s\n' "$*" >&2
    exit 1
}

# The GPU tests: the engine's candle path against the native kernels (tiny models of every
# family and the real ones), the runtime's cached inference on the real models, and the store's
# device tier in the GPU's memory.
# GPU_TESTS (space-separated crate:test) packs fewer, so a call carries more of the model.
TEST_TARGETS=(
    "pml-engine:backends"
    "pml-runtime:cached_inference_real"
    "pml-runtime:restore"
    "pml-store:store"
)
if [ -n "${GPU_TESTS:-}" ]; then
    read -ra TEST_TARGETS <<<"$GPU_TESTS"
fi

write_stubs() {
    local version cudarc
    version="$(grep -A1 '^name = "cudarc"$' Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')"
    [ -n "$version" ] || die "cudarc is not in Cargo.lock"
    cudarc="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"cudarc-$version" | head -1)"
    [ -d "$cudarc" ] || die "cudarc $version's sources are not in the cargo registry"
    mkdir -p "$STUBS"
    # module of cudarc's bindings : library : SONAME of the real library
    local spec module lib soname
    for spec in driver:cuda:libcuda.so.1 cublas:cublas:libcublas.so.13 \
        cublaslt:cublasLt:libcublasLt.so.13 curand:curand:libcurand.so.10 \
        nvrtc:nvrtc:libnvrtc.so.13; do
        IFS=: read -r module lib soname <<<"$spec"
        grep -oE '^ +fn [A-Za-z0-9_]+\(' "$cudarc/src/$module/sys/mod.rs" |
            sed -E 's/^ +fn ([A-Za-z0-9_]+)\(/void \1(void) {}/' | sort -u >"$STUBS/$lib.c"
        [ -s "$STUBS/$lib.c" ] || die "no functions found in cudarc's $module bindings"
        cc -shared -fPIC -o "$STUBS/lib$lib.so" "$STUBS/$lib.c" "-Wl,-soname,$soname"
    done
    # candle-kernels' static MoE kernels need the CUDA runtime, which the toolkit's wheel has
    # (as libcudart.so.13 only: the unversioned name is what the linker asks for).
    ln -sf "$CUDA_ROOT/lib/libcudart.so.13" "$STUBS/libcudart.so"
    log "stub libraries in $STUBS"
}

build() {
    # shellcheck source=scripts/cuda-env.sh
    source scripts/cuda-env.sh
    write_stubs
    export CARGO_TARGET_DIR="$TARGET_DIR"
    export RUSTFLAGS="${RUSTFLAGS:-} -L native=$PWD/$STUBS"
    log "cargo build --release --features cuda -p pml-cli (into $TARGET_DIR)"
    cargo build --release --features cuda -p pml-cli
    local target crate test
    for target in "${TEST_TARGETS[@]}"; do
        IFS=: read -r crate test <<<"$target"
        log "test binary $crate/$test"
        cargo test --release --features cuda -p "$crate" --test "$test" --no-run
    done
    log "ok: $TARGET_DIR/release/pml"
}

# The newest test binary of `test` (cargo names them test-<hash>).
test_binary() {
    ls -t "$TARGET_DIR/release/deps/$1"-* 2>/dev/null | grep -v '\.d$' | head -1
}

pack() {
    local path="${1:-${PML_HOME:-$HOME/.cache/pml}/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
    [ -f "$path" ] || die "$path is not a file (pml models fetch smollm2-135m puts it there)"
    local all="$GPU_DIR/all"
    rm -rf "$GPU_DIR"
    mkdir -p "$all"
    # Stripped (the release profile keeps line tables) and compressed: calls carry 64 MiB.
    shrink() { strip -o "$all/$2" "$1" && gzip -9 "$all/$2"; }
    shrink "$TARGET_DIR/release/pml" pml
    local target crate test binary
    for target in "${TEST_TARGETS[@]}"; do
        IFS=: read -r crate test <<<"$target"
        binary="$(test_binary "$test")"
        [ -n "$binary" ] || die "no test binary for $test: run \`$0 build\` first"
        shrink "$binary" "test-$test"
    done
    # transformers reads GGUF files through the `gguf` package, which the GPU machine lacks.
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform any -d "$all" gguf==0.19.0 ||
        die "pip could not download the gguf wheel"
    split -b "${PIECE_MIB}m" -d "$path" "$all/model.gguf.part-"
    basename "$path" >"$all/model.name"
    sha256sum "$path" | cut -d' ' -f1 >"$all/model.sha256"
    # One folder per call, in order, each under CALL_MIB: the binaries first (the first call
    # already runs the tiny-model GPU tests), then the wheel and the model's pieces; the model's
    # name and checksum ride along in each.
    # First fit: each file goes into the first call with room, so the model's small pieces
    # fill what the binaries leave.
    local call size file limit=$((CALL_MIB * 1024 * 1024))
    local -a used=()
    for file in "$all"/pml.gz "$all"/test-*.gz "$all"/gguf-*.whl "$all"/model.gguf.part-*; do
        size="$(stat -c %s "$file")"
        call=1
        while [ -n "${used[$call]:-}" ] && [ $((used[call] + size)) -gt "$limit" ]; do
            call=$((call + 1))
        done
        mkdir -p "$GPU_DIR/call-$call"
        ln "$file" "$GPU_DIR/call-$call/"
        used[call]=$((${used[$call]:-0} + size))
    done
    for folder in "$GPU_DIR"/call-*; do
        cp "$all/model.name" "$all/model.sha256" "$folder/"
        printf '%s: %s\n' "$folder" "$(du -sh "$folder" | cut -f1)"
    done
    log "carry each in turn, back to back (a machine idle for 30 s is given back, and the stash with it): run(carry=[\"$GPU_DIR/call-N\"], command=\"bash scripts/gpu-check.sh stash $GPU_DIR/call-N\") for all but the last, then \"bash scripts/gpu-check.sh device $GPU_DIR/call-LAST\""
}

# Where PyTorch keeps the CUDA libraries the binary was linked against.
torch_cuda_libs() {
    python3 - <<'EOF'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = set()
for root in roots:
    for name in ("libcublas.so.*", "libcublasLt.so.*", "libcurand.so.*", "libnvrtc.so.*", "libcudart.so.*"):
        for path in glob.glob(os.path.join(root, "nvidia", "**", name), recursive=True):
            dirs.add(os.path.dirname(path))
print(":".join(sorted(dirs)))
EOF
}

# Stashes the carried folder, unpacks the binaries, puts the CUDA libraries on the loader's path
# and reassembles the model once its last piece has arrived; sets MODEL_ARGS.
prepare() {
    local carried="${1:-}"
    mkdir -p "$GPU_STASH"
    # Pieces carried by earlier calls wait in the stash; this call's join them.
    [ -n "$carried" ] && cp -f "$carried"/* "$GPU_STASH"/
    cd "$GPU_STASH"
    for gz in *.gz; do
        [ -e "$gz" ] || continue
        gunzip -kf "$gz" && chmod +x "${gz%.gz}"
    done
    local libs driver
    libs="$(torch_cuda_libs)"
    # The driver's libcuda.so.1, where the loader's cache may not list it.
    for driver in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
        [ -e "$driver/libcuda.so.1" ] && libs="$libs:$driver"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    log "CUDA libraries from PyTorch: $libs"
    [ -x ./pml ] || die "pml has not arrived in $GPU_STASH yet"
    ldd ./pml | grep -E 'cuda|cublas|curand|nvrtc' || true

    export PML_HOME="$GPU_STASH/home" PML_DEVICE=cuda PML_REQUIRE_GPU=1
    local name
    name="$(cat model.name 2>/dev/null || true)"
    if [ -n "$name" ] && ls model.gguf.part-* >/dev/null 2>&1; then
        cat model.gguf.part-* >"$name.tmp"
        if [ "$(sha256sum "$name.tmp" | cut -d' ' -f1)" = "$(cat model.sha256)" ]; then
            # Where `pml models` and the real-model tests look for it (hashed and stamped once).
            mkdir -p "$PML_HOME/models"
            mv "$name.tmp" "$PML_HOME/models/$name"
            rm -f model.gguf.part-*
            log "model $name reassembled"
        else
            rm -f "$name.tmp"
            log "model $name: not every piece has arrived yet"
        fi
    fi
    MODEL_ARGS=()
    [ -n "$name" ] && [ -f "$PML_HOME/models/$name" ] && MODEL_ARGS=(--model "$PML_HOME/models/$name")
    return 0
}

device() {
    local repo="$PWD"
    prepare "${1:-}"
    local model_args=("${MODEL_ARGS[@]}")

    log "== GPU tests"
    for test in test-*; do
        [ -z "${SKIP_TESTS:-}" ] || break
        case "$test" in *.gz) continue ;; esac
        [ -x "$test" ] || continue
        log "$test"
        ./"$test" --test-threads 1 --nocapture 2>&1 | grep -v "^$" | tail -40 || log "$test FAILED"
    done
    if [ ${#model_args[@]} -gt 0 ]; then
        log "== pml generate on the GPU"
        ./pml generate "${model_args[@]}" --device cuda --max-tokens 32 "The capital of France is" || true
        # WEIGHTS:CACHE[:VAR=VALUE] runs. Weights: the GGUF's blocks (candle's MMQ kernels at
        # every row count) or f16 copies for prefill (cuBLAS on tensor cores); cache: f32
        # (exact attention) or f16/bf16 (attention on tensor cores: the flash-attention kernel,
        # or the ops path with PML_NO_FLASH_ATTENTION=1); VAR=VALUE: set for that run only.
        local run weights cache setting
        for run in ${ENGINE_RUNS:-quantized:f32 quantized-and-f16:f16:PML_NO_FLASH_ATTENTION=1 quantized-and-f16:f16}; do
            IFS=: read -r weights cache setting <<<"$run"
            log "== bench engine: cuda, --weights $weights --cache-type $cache ${setting:-}"
            env ${setting:-} ./pml bench engine "${model_args[@]}" --device cuda --weights "$weights" --cache-type "$cache" \
                --no-llama --sizes "${SIZES:-512,2048,4096}" --rounds 3 --decode 32 || true
        done
        log "== PyTorch eager (transformers) on the same GGUF and token ids"
        if ls gguf-*.whl >/dev/null 2>&1; then
            python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site gguf-*.whl &&
                PYTHONPATH=/tmp/site python3 "$repo/scripts/torch_engine_bench.py" "${model_args[@]}" \
                    --sizes "${SIZES:-512,2048,4096}" --rounds 3 --decode 32 || true
        fi
        for run in ${CACHE_RUNS:-quantized:f32 quantized-and-f16:f16:PML_NO_FLASH_ATTENTION=1 quantized-and-f16:f16}; do
            IFS=: read -r weights cache setting <<<"$run"
            log "== bench cache: reuse vs full on the GPU, --weights $weights --cache-type $cache ${setting:-}, states in the device tier"
            rm -rf /tmp/pml-bench-store
            env ${setting:-} ./pml bench cache "${model_args[@]}" --device cuda --weights "$weights" --cache-type "$cache" \
                --no-examples --store "device:8GiB,disk:/tmp/pml-bench-store" \
                --sizes "${CACHE_SIZES:-1024,4096}" --runs 3 || true
        done
        if [ -n "${BLOCKING_CHECK:-}" ]; then
            # With every launch synchronous, TTFT is the host's time plus the GPU's: how much of
            # the ordinary TTFT the two already overlap.
            log "== bench engine with CUDA_LAUNCH_BLOCKING=1 (host and GPU serialised)"
            CUDA_LAUNCH_BLOCKING=1 ./pml bench engine "${model_args[@]}" --device cuda --no-llama \
                --sizes "${SIZES:-512,2048,4096}" --rounds 3 --decode 32 || true
        fi
        if [ -n "${PROFILE:-}" ]; then
            log "== where a ${PROFILE_TOKENS:-4096}-token prefill's GPU time goes (pml generate $PROFILE_ARGS)"
            (cd "$repo" && timeout "${PROFILE_TIMEOUT:-150}" bash scripts/gpu-check.sh profile) || true
        fi
        if [ -n "${CPU_BENCH:-}" ]; then
            log "== bench engine: the CPU's 16 cores, native kernels"
            ./pml bench engine "${model_args[@]}" --device cpu --no-llama --sizes "${SIZES:-512,2048,4096}" --rounds 1 --decode 32 || true
        fi
    fi
}

# Time per CUDA kernel of one prefill of $PROFILE_TOKENS tokens and one decode step (Nsight
# Compute, duration only), summed per kernel name, sorted: where a prefill's time goes.
profile() {
    prepare "${1:-}"
    [ ${#MODEL_ARGS[@]} -gt 0 ] || die "the model has not arrived yet"
    local text
    text="$(python3 -c "print('word ' * ${PROFILE_TOKENS:-2048})")"
    # shellcheck disable=SC2086 # PROFILE_ARGS: extra flags, split on spaces
    ncu --target-processes all --metrics gpu__time_duration.sum --csv --page raw \
        ./pml generate "${MODEL_ARGS[@]}" --device cuda ${PROFILE_ARGS:-} --max-tokens 2 "$text" >ncu.csv 2>ncu.err || {
        tail -20 ncu.err
        die "ncu failed"
    }
    python3 - ncu.csv <<'EOF'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
header = next(i for i, row in enumerate(rows) if "Kernel Name" in row)
names = rows[header]
name_at, time_at = names.index("Kernel Name"), names.index("gpu__time_duration.sum")
unit = rows[header + 1][time_at]
totals, counts = collections.Counter(), collections.Counter()
for row in rows[header + 2:]:
    try:
        totals[row[name_at][:70]] += float(row[time_at].replace(",", ""))
        counts[row[name_at][:70]] += 1
    except (ValueError, IndexError):
        pass
total = sum(totals.values())
print(f"{sum(counts.values())} kernels, {total:.1f} {unit} of GPU time")
for name, time in totals.most_common(25):
    print(f"{time:12.1f} {unit} {100 * time / total:5.1f}%  {counts[name]:6d}x  {name}")
EOF
}

# Keeps a carried folder's pieces in the stash for a later call, running nothing.
stash() {
    mkdir -p "$GPU_STASH"
    cp -f "$1"/* "$GPU_STASH"/
    log "stashed $1: $(du -sh "$GPU_STASH" | cut -f1) in $GPU_STASH"
}

case "${1:-}" in
build) build ;;
stash) stash "${2:?usage: $0 stash DIR}" ;;
pack) pack "${2:-}" ;;
device) device "${2:-}" ;;
profile) profile "${2:-}" ;;
*) die "usage: $0 build | pack [GGUF] | stash DIR | device DIR | profile DIR" ;;
esac
