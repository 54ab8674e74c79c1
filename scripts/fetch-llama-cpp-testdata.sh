#!/usr/bin/env bash
# Fetches llama.cpp's own test data — the vocab-only GGUFs with their tokenizer test pairs
# (`ggml-vocab-*.gguf`, `.inp`, `.out`) and real chat templates (`templates/*.jinja`) — from the
# llama-cpp-python sdist on PyPI, into $PML_HOME/llama-cpp-testdata/<version>/models.
#
# Why the sdist: it vendors llama.cpp whole, and PyPI is the one registry this project reaches.
# pip only saves an sdist after preparing its metadata, which for llama-cpp-python needs
# scikit-build-core and CMake: both come as wheels into a small cached venv, nothing is built.
#
# Idempotent: exits at once when the data is in place (the folder appears by one rename).
# Prints the models folder on its last line.
#
# Environment:
#   PML_HOME            cache root (default ~/.cache/pml)
#   LLAMA_CPP_VERSION   llama-cpp-python version (default 0.3.36, as setup-llama-cpp.sh)
#   PYTHON              interpreter for the venv (default python3)
set -euo pipefail

PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"
ROOT="$PML_HOME/llama-cpp-testdata"
DEST="$ROOT/$VERSION"

log() { printf '[fetch-llama-cpp-testdata] %s\n' "$*" >&2; }

if [ -f "$DEST/models/ggml-vocab-qwen2.gguf.out" ]; then
    echo "$DEST/models"
    exit 0
fi

# shellcheck source=scripts/llama-cpp-common.sh
source "$(dirname "$0")/llama-cpp-common.sh"
llama_unpack "$ROOT" models/
work="$LLAMA_WORK"
mkdir -p "$work/out"
mv "$LLAMA_SOURCE/models" "$work/out/models"
rm -rf "$DEST"
mv "$work/out" "$DEST"
log "llama.cpp test data in $DEST/models"
echo "$DEST/models"
