#!/usr/bin/env bash
# Builds llama-cpp-python from source (CPU only) into a cached virtual environment.
#
# Why from source: the prebuilt wheels and a native (-march=native) build both pull in
# AMX code paths, which crashed on this machine. The SIMD level is therefore chosen
# explicitly from /proc/cpuinfo rather than hard-coded, so the same script works on
# machines with and without AVX-512.
#
# Idempotent: exits early when the venv already imports llama_cpp at the wanted version.
#
# Environment:
#   PML_HOME            cache root (default ~/.cache/pml); the venv is $PML_HOME/venv-llama-cpp
#   LLAMA_CPP_VERSION   llama-cpp-python version to build (default 0.3.36)
#   PYTHON              interpreter used to create the venv (default python3)
set -euo pipefail

PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
VENV="$PML_HOME/venv-llama-cpp"
VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"

log() { printf '[setup-llama-cpp] %s\n' "$*"; }

if [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
    log "llama-cpp-python $VERSION already installed in $VENV; nothing to do"
    exit 0
fi

# One ON/OFF per CPU feature; a flag missing from /proc/cpuinfo must stay OFF or the
# library dies with SIGILL on first use.
cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
has() { case " ${cpu_flags#*:} " in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }

AVX=$(has avx)
AVX2=$(has avx2)
FMA=$(has fma)
F16C=$(has f16c)
AVX512=$(has avx512f)
AVX512_VBMI=$(has avx512vbmi)
AVX512_VNNI=$(has avx512_vnni)
AVX512_BF16=$(has avx512_bf16)
AVX_VNNI=$(has avx_vnni)

CMAKE_ARGS="-DGGML_NATIVE=OFF \
-DGGML_AVX=$AVX -DGGML_AVX2=$AVX2 -DGGML_FMA=$FMA -DGGML_F16C=$F16C \
-DGGML_AVX512=$AVX512 -DGGML_AVX512_VBMI=$AVX512_VBMI -DGGML_AVX512_VNNI=$AVX512_VNNI \
-DGGML_AVX512_BF16=$AVX512_BF16 -DGGML_AVX_VNNI=$AVX_VNNI \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
-DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF \
-DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF"
CMAKE_ARGS="$(echo "$CMAKE_ARGS" | tr -s ' ')"
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

"$VENV/bin/python" - <<EOF
import llama_cpp
assert llama_cpp.__version__ == "$VERSION", llama_cpp.__version__
print("[setup-llama-cpp] imported llama_cpp", llama_cpp.__version__)
print("[setup-llama-cpp] system info:", llama_cpp.llama_print_system_info().decode())
EOF
log "build and install took $((end - start)) s"
