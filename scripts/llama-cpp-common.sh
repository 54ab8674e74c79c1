#!/usr/bin/env bash
# Sourced, not run: what the scripts that build or unpack llama.cpp share.
#
#   llama_cmake_args        CMake flags for a CPU-only llama.cpp with exactly this machine's SIMD
#                           levels (from /proc/cpuinfo), no AMX, no GPU backends; with
#                           PML_NO_AVX512=1, none of AVX-512 either (the peer of PML's AVX2
#                           paths on an AVX-512 machine)
#   llama_unpack ROOT PART  downloads the llama-cpp-python sdist (which vendors llama.cpp whole)
#                           and unpacks its vendor/llama.cpp/PART (all of it for "") into a
#                           scratch folder under ROOT, removed when the script exits; sets
#                           LLAMA_WORK (that folder) and LLAMA_SOURCE (its vendor/llama.cpp)
#
# Why the flags are spelled out: the prebuilt wheels and a native (-march=native) build both
# pull in AMX code paths, which crashed on a development machine; a flag missing from
# /proc/cpuinfo must stay OFF or the library dies with SIGILL on first use.
# Why the sdist: PyPI is the one registry this project reaches. pip only saves an sdist after
# preparing its metadata, which for llama-cpp-python needs scikit-build-core and CMake: both come
# as wheels into a small cached venv ($PML_HOME/venv-sdist), nothing is built there.
#
# Environment: PML_HOME (default ~/.cache/pml), LLAMA_CPP_VERSION (default 0.3.36), PYTHON.

PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
LLAMA_CPP_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"

llama_cmake_args() {
    local cpu_flags
    cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
    has() {
        case "${PML_NO_AVX512:-}:$1" in 1:avx512*) echo OFF; return ;; esac
        case " ${cpu_flags#*:} " in *" $1 "*) echo ON ;; *) echo OFF ;; esac
    }
    echo "-DGGML_NATIVE=OFF \
-DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c) \
-DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512vbmi) \
-DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16) \
-DGGML_AVX_VNNI=$(has avx_vnni) \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
-DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF \
-DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF" | tr -s ' '
}

llama_sdist() {
    local dir="$1" venv="$PML_HOME/venv-sdist"
    if [ ! -x "$venv/bin/python" ]; then
        mkdir -p "$PML_HOME"
        "$PYTHON" -m venv "$venv" >&2
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check scikit-build-core cmake >&2
    PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip download --quiet --disable-pip-version-check \
        --no-deps --no-binary :all: --no-build-isolation "llama-cpp-python==$LLAMA_CPP_VERSION" \
        -d "$dir" >&2
    local sdist="$dir/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
    [ -f "$sdist" ] || {
        printf 'pip saved no %s\n' "$sdist" >&2
        return 1
    }
    echo "$sdist"
}

# In the script's own shell, not in $(...): it sets the script's exit trap.
llama_unpack() {
    local root="$1" part="$2" sdist
    mkdir -p "$root"
    LLAMA_WORK="$(mktemp -d "$root/.work.XXXXXX")"
    trap 'rm -rf "$LLAMA_WORK"' EXIT
    printf '[llama-cpp] downloading the llama-cpp-python %s sdist from PyPI\n' \
        "$LLAMA_CPP_VERSION" >&2
    sdist="$(llama_sdist "$LLAMA_WORK")"
    LLAMA_SOURCE="$LLAMA_WORK/llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp"
    tar -xzf "$sdist" -C "$LLAMA_WORK" \
        "llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp/$part"
}
