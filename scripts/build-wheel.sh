#!/usr/bin/env bash
# Builds PML's Python wheel with maturin: the module `pml` (crates/pml-python) and the `pml` and
# `pmlc` binaries, which pip installs as commands next to the environment's python.
#
# Usage: scripts/build-wheel.sh [PROFILE] [OUT]
#   PROFILE  cargo profile (default `release`; `dev` reuses a test build's optimised dependencies)
#   OUT      folder the wheel is written to (default target/wheels)
# Environment: PML_HOME (default ~/.cache/pml): maturin is installed in $PML_HOME/venv-maturin.
#   PML_WHEEL_BINARIES: a folder holding `pml` and `pmlc` already built (CI's test build), taken
#   instead of building them.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE="${1:-release}"
OUT="${2:-target/wheels}"
PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
VENV="$PML_HOME/venv-maturin"
MATURIN_VERSION=1.16.0

if ! "$VENV/bin/maturin" --version 2>/dev/null | grep -q "$MATURIN_VERSION"; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "maturin==$MATURIN_VERSION"
fi
if [ -n "${PML_WHEEL_BINARIES:-}" ]; then
    built="$PML_WHEEL_BINARIES"
else
    cargo build --quiet --profile "$PROFILE" -p pml-cli --bins
    case "$PROFILE" in
        dev) built=target/debug ;;
        *) built="target/$PROFILE" ;;
    esac
fi
scripts_dir=crates/pml-python/wheel-data/scripts
rm -rf "$scripts_dir"
mkdir -p "$scripts_dir"
cp "$built/pml" "$built/pmlc" "$scripts_dir/"
# The line tables the profiles keep for profiling are a tenth of a wheel nobody debugs.
strip "$scripts_dir/pml" "$scripts_dir/pmlc"
mkdir -p "$OUT"
"$VENV/bin/maturin" build --quiet --strip --profile "$PROFILE" -m crates/pml-python/Cargo.toml --out "$OUT"
ls "$OUT"/pml-*.whl
