#!/usr/bin/env bash
# Proves that the `cuda` feature builds on a machine without a GPU: installs the CUDA
# toolkit pieces the build needs from NVIDIA's PyPI wheels into a cached virtual environment
# (scripts/cuda-env.sh), then runs `cargo check -p pml-engine --features cuda`: the feature's code
# is in pml-kernels and pml-engine alone (the crates above them forward it), and
# `cargo tree` resolves the binaries' feature graph to prove the forwarding. candle-kernels'
# build script runs nvcc on all of candle's CUDA kernels even under `cargo check`, so this also
# proves those kernels compile (or, from the cache, that these very sources did with this very
# toolkit and flags); nothing is linked.
set -euo pipefail
# shellcheck source=scripts/cuda-env.sh
source "$(dirname "$0")/cuda-env.sh"
# candle-kernels' nvcc run, the step's cost (~4.5 min on two cores), through a cache of what it
# compiled from the same sources, flags and toolkit (scripts/nvcc-cached.sh): the first check on
# a machine compiles every kernel, later ones only what changed.
export PML_NVCC_REAL="$NVCC" PML_NVCC_CACHE="$PML_HOME/nvcc-cache"
NVCC="$(pwd)/scripts/nvcc-cached.sh"
export NVCC

cargo tree -p pml-cli --features cuda -e features -i candle-core 2>/dev/null | grep -q 'candle-core feature "cuda"' ||
    die "pml-cli's cuda feature does not reach candle-core's"
log "cargo check -p pml-engine --features cuda (candle-kernels' build script compiles every kernel with nvcc)"
cargo check -p pml-engine --features cuda ||
    die "cargo check -p pml-engine --features cuda failed (see above: an nvcc error is candle-kernels', a rustc error the workspace's)"
log "ok: the cuda feature builds"
