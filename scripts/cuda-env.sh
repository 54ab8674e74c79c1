#!/usr/bin/env bash
# Sourced, not run: puts the CUDA toolkit that candle's `cuda` feature needs on this machine (no
# GPU, driver or root needed) and exports the variables its build scripts read. Used by
# scripts/check-cuda-build.sh (cargo check in CI) and scripts/gpu-check.sh (the release build
# carried to a GPU machine).
#
# The toolkit comes from NVIDIA's PyPI wheels, in a cached virtual environment. Idempotent: the
# venv is created once and reused while it holds the pinned versions.
#
# Why CUDA 13 and not the `-cu12` wheels: every nvidia-cuda-nvcc-cu12 wheel (12.1 to 12.9) ships
# only ptxas and libnvvm, not the nvcc driver; from CUDA 13 on, nvidia-cuda-nvcc ships nvcc, and
# all the CUDA 13 wheels unpack into one toolkit root (site-packages/nvidia/cu13) laid out like
# /usr/local/cuda. 13.0 is the oldest CUDA 13, so its PTX asks the least recent driver (R580) of
# the GPU machines; cudarc 0.19 accepts 13.0 to 13.4 (an `nvcc --version` outside that panics).
#
# Environment:
#   PML_HOME           cache root (default ~/.cache/pml); the venv is $PML_HOME/venv-cuda
#   CUDA_WHEELS        CUDA wheel version (default 13.0.88; cccl has its own, CCCL_VERSION 13.0.85)
#   CUDA_COMPUTE_CAP   GPU architecture the kernels are compiled for (default 90: H100)
#   CUDAFORGE_THREADS  nvcc processes run at once (default: every core)
#   PYTHON             interpreter used to create the venv (default python3)
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
VENV="$PML_HOME/venv-cuda"
VERSION="${CUDA_WHEELS:-13.0.88}"
CCCL_VERSION="${CCCL_VERSION:-13.0.85}"
PYTHON="${PYTHON:-python3}"

log() { printf '[cuda-env] %s\n' "$*"; }
die() {
    printf '[cuda-env] error: %s\n' "$*" >&2
    exit 1
}

# nvcc (driver, cudafe++, ptxas, fatbinary), its crt headers, cicc and libdevice, the runtime
# headers (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, cuda_fp8.h) and CCCL (cub, and nv/target
# which cuda_fp16.hpp includes): what candle-kernels' .cu files need, nothing more (no torch,
# no cuBLAS: those are only linked or loaded at run time).
PACKAGES=(
    "nvidia-cuda-nvcc==$VERSION"
    "nvidia-cuda-crt==$VERSION"
    "nvidia-nvvm==$VERSION"
    "nvidia-cuda-runtime==$VERSION"
    "nvidia-cuda-cccl==$CCCL_VERSION"
)

# True when the venv holds exactly the pinned wheels.
venv_ready() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "${PACKAGES[@]}" 2>/dev/null <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, wanted = spec.split("==")
    try:
        if version(name) != wanted:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
}

if venv_ready; then
    log "CUDA $VERSION wheels already installed in $VENV; skipping install"
else
    log "installing CUDA $VERSION wheels into $VENV: ${PACKAGES[*]}"
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found (needed to create $VENV)"
    # A venv left half-made by an interrupted run is replaced rather than patched.
    rm -rf "$VENV"
    mkdir -p "$PML_HOME"
    "$PYTHON" -m venv "$VENV" || die "could not create $VENV (is python3-venv installed?)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" ||
        die "pip could not install ${PACKAGES[*]} (PyPI reachable? x86_64/aarch64 Linux only)"
    venv_ready || die "pip finished but $VENV does not hold ${PACKAGES[*]}"
fi

CUDA_ROOT="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13"
for file in bin/nvcc bin/cudafe++ bin/ptxas nvvm/bin/cicc include/cuda_runtime.h include/cuda_fp16.h \
    include/cuda_bf16.h include/cccl/cub/cub.cuh include/nv/target; do
    [ -e "$CUDA_ROOT/$file" ] || die "$CUDA_ROOT/$file is missing: the wheels' layout changed; delete $VENV and rerun, or update PACKAGES"
done

# cudarc's build script takes the CUDA version from `nvcc --version` found on PATH (it has no
# other way short of CUDARC_CUDA_VERSION), and cudaforge (candle-kernels' build helper) looks
# for nvcc on PATH too.
export PATH="$CUDA_ROOT/bin:$PATH"
# cudaforge tries $NVCC first: pinning it means a system nvcc never gets mixed with these headers.
export NVCC="$CUDA_ROOT/bin/nvcc"
# cudarc's build script replaces its default library search paths (/usr, /usr/local/cuda, ...)
# by these roots; cudaforge falls back to CUDA_HOME/CUDA_PATH. Under `check` nothing is linked,
# but a later `cargo build` with the same environment then links against this toolkit.
export CUDA_ROOT CUDA_PATH="$CUDA_ROOT" CUDA_HOME="$CUDA_ROOT"
# Without it cudaforge asks nvidia-smi for the GPU's architecture, which fails where there is
# no GPU. 90 is the H100 of the GPU machines.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
# cudaforge compiles the kernels on half the cores by default (one on a 2-core CI machine), and
# nvcc is nearly all of this script's cold time; at that point cargo has little else to run.
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
# No NVCC include flags (NVCC_APPEND_FLAGS): nvcc.profile in this root already adds
# -I$CUDA_ROOT/include and -isystem $CUDA_ROOT/include/cccl, where the wheels put the headers.

nvcc_version="$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
[ -n "$nvcc_version" ] || die "$NVCC --version did not run or print a release"
log "nvcc $nvcc_version at $NVCC; CUDA_ROOT=$CUDA_ROOT; CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"

