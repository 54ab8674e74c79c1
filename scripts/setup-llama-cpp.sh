#!/usr/bin/env bash
# Builds llama-cpp-python from source (CPU only) into a cached virtual environment.
#
# Why from source: the prebuilt wheels and a native (-march=native) build both pull in
# AMX code paths, which crashed on this machine. The SIMD level is therefore chosen
# explicitly from /proc/cpuinfo rather than hard-coded (scripts/llama-cpp-common.sh), so the
# same script works on machines with and without AVX-512.
#
# Idempotent: exits early when the venv already imports llama_cpp at the wanted version.
#
# Environment:
#   PML_HOME            cache root (default ~/.cache/pml); the venv is $PML_HOME/venv-llama-cpp
#   PML_NO_AVX512       1: built without AVX-512 (beside PML's AVX2 paths, `PML_NO_AVX512=1`),
#                       into $PML_HOME/venv-llama-cpp-no512
#   LLAMA_CPP_VERSION   llama-cpp-python version to build (default 0.3.36)
#   PYTHON              interpreter used to create the venv (default python3)
set -euo pipefail

PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
VENV="$PML_HOME/venv-llama-cpp"
if [ "${PML_NO_AVX512:-}" = 1 ]; then VENV="$VENV-no512"; fi
VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"

log() { printf '[setup-llama-cpp] %s\n' "$*"; }

# gguf-py, at the version the sdist vendors: scripts/shaped_gguf.py writes real-size files with it.
ensure_gguf() {
    "$VENV/bin/python" -c "import gguf" 2>/dev/null ||
        "$VENV/bin/python" -m pip install --quiet "gguf==0.19.0"
}

if [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
    ensure_gguf
    log "llama-cpp-python $VERSION already installed in $VENV; nothing to do"
    exit 0
fi

# shellcheck source=scripts/llama-cpp-common.sh
source "$(dirname "$0")/llama-cpp-common.sh"
CMAKE_ARGS="$(llama_cmake_args)"
export CMAKE_ARGS FORCE_CMAKE=1
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

log "venv:       $VENV"
log "version:    llama-cpp-python $VERSION (built from the sdist)"
log "CMAKE_ARGS: $CMAKE_ARGS"

if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv with $PYTHON"
    mkdir -p "$PML_HOME"
    "$PYTHON" -m venv "$VENV"
fi

log "installing build tools (pip, cmake, ninja) into the venv"
"$VENV/bin/python" -m pip install --quiet --upgrade pip cmake ninja

export PATH="$VENV/bin:$PATH"
start=$(date +%s)
log "building llama-cpp-python $VERSION from source (this takes a while on few cores)"
"$VENV/bin/python" -m pip install --no-cache-dir --no-binary llama-cpp-python \
    --force-reinstall "llama-cpp-python==$VERSION"
end=$(date +%s)

ensure_gguf
"$VENV/bin/python" - <<EOF
import llama_cpp
assert llama_cpp.__version__ == "$VERSION", llama_cpp.__version__
print("[setup-llama-cpp] imported llama_cpp", llama_cpp.__version__)
print("[setup-llama-cpp] system info:", llama_cpp.llama_print_system_info().decode())
EOF
log "build and install took $((end - start)) s"
