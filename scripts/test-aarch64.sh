#!/usr/bin/env bash
# The ARM path. Cross-builds the engine's tiny-model tests for aarch64 Linux and runs
# them under qemu's user-mode emulator: no AVX2 there, so the quantized matmuls take candle's
# kernels (NEON) and everything else the portable code. Needs Debian's gcc-aarch64-linux-gnu
# and qemu-user (installed here when absent, as `.ci/run` installs its other tools) and the
# rustup target (added when absent).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu

need_apt=()
command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need_apt+=(qemu-user)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "== installing ${need_apt[*]}"
    { apt-get install -y "${need_apt[@]}" || { apt-get update && apt-get install -y "${need_apt[@]}"; }; } >/dev/null
fi
rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET"

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar

# The crates with architecture-specific code cross-build and their tests run: pml-kernels' own
# (the SIMD kernels' portable fallbacks against their references) and the engine's tiny-model
# tests, every family against the native path, which on ARM is our portable code with candle's
# quantized kernels (`backends`' `quantized_matrices_take_our_kernels_only_with_avx2` asserts
# the latter). The rest of the workspace holds no code that differs by architecture, so its
# native build covers it. The real-model comparison is left to the native runs: under emulation
# it takes minutes.
# Less one: the f16 attention test checks CUDA's half-precision path against a bound of f16's
# rounding with f32 accumulation; on aarch64 candle's CPU matmul (gemm's NEON fp16 kernel)
# accumulates in f16, 0.0087 off at 300 keys where x86 and CUDA stay under 0.004. PML's CPU KV
# cache is f32 unless `--cache-type f16` is asked for.
# Both commands name the same two packages, so cargo resolves one feature set and compiles each
# dependency once (alone, `-p pml-kernels` resolves candle-core and tokenizers with other features
# than pml-engine's tests need, and both were compiled twice); the first also runs the engine's
# own unit tests.
packages=(-p pml-kernels -p pml-engine)
cargo test --target "$TARGET" "${packages[@]}" --lib -- --skip half_precision_products_stay_near_f32
cargo test --target "$TARGET" "${packages[@]}" --test engine_tiny --test backends -- --skip real_models
