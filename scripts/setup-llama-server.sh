#!/usr/bin/env bash
# Builds llama.cpp's own server (`llama-server`) from the llama.cpp that the llama-cpp-python
# sdist vendors — the same sources `scripts/setup-llama-cpp.sh` builds the library from, with the
# same CPU flags (this machine's SIMD levels from /proc/cpuinfo, no AMX): the peer of `pml serve`
# in serving benchmarks, same GGUF, same machine.
#
# Idempotent: exits at once when the binary is in place and runs. Prints its path on the last
# line. The build appears by one rename, so an interrupted run leaves nothing half-built.
#
# Environment:
#   PML_HOME            cache root (default ~/.cache/pml); the binary is
#                       $PML_HOME/llama-server/<version>/llama-server
#   LLAMA_CPP_VERSION   llama-cpp-python version whose llama.cpp is built (default 0.3.36)
#   CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: every core)
set -euo pipefail
# shellcheck source=scripts/llama-cpp-common.sh
source "$(dirname "$0")/llama-cpp-common.sh"

ROOT="$PML_HOME/llama-server"
DEST="$ROOT/$LLAMA_CPP_VERSION"
BINARY="$DEST/llama-server"

log() { printf '[setup-llama-server] %s\n' "$*" >&2; }

if [ -x "$BINARY" ] && "$BINARY" --version >/dev/null 2>&1; then
    log "llama-server of llama-cpp-python $LLAMA_CPP_VERSION already built"
    echo "$BINARY"
    exit 0
fi
command -v cc >/dev/null && command -v c++ >/dev/null || {
    log "a C and C++ compiler are needed (Debian: apt-get install build-essential)"
    exit 1
}

llama_unpack "$ROOT" ""
work="$LLAMA_WORK"
source_dir="$LLAMA_SOURCE"
[ -d "$source_dir/tools/server" ] || {
    log "this sdist's llama.cpp has no tools/server"
    exit 1
}

# CMake (and Ninja) as wheels, from the venv the sdist download already made.
venv="$PML_HOME/venv-sdist"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check ninja >&2
export PATH="$venv/bin:$PATH"
args="$(llama_cmake_args)"
log "CMake flags: $args"
# shellcheck disable=SC2086 # the flags are one word each
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $args >&2
start=$(date +%s)
log "building llama-server (several minutes on few cores)"
cmake --build "$work/build" --target llama-server \
    --parallel "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" >&2
log "built in $(($(date +%s) - start)) s"

mkdir -p "$work/out"
cp "$work/build/bin/llama-server" "$work/out/llama-server"
"$work/out/llama-server" --version >&2
rm -rf "$DEST"
mv "$work/out" "$DEST"
log "llama-server in $DEST"
echo "$BINARY"
