#!/usr/bin/env bash
# Builds the Python wheel (scripts/build-wheel.sh), installs it with pytest into a fresh venv and
# runs crates/pml-python/tests/test_pml.py there: the installed `pml` and `pmlc` commands and the
# module `pml` answer the example prompt alike.
#
# Usage: scripts/test-wheel.sh [PROFILE]   (default `dev`: CI's test build is reused)
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE="${1:-dev}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
bash scripts/build-wheel.sh "$PROFILE" "$scratch/wheels" >/dev/null
python3 -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "$scratch"/wheels/pml-*.whl pytest
# From outside the repository, so that `import pml` can only be the installed wheel.
cd "$scratch"
"$scratch/venv/bin/python" -m pytest -q "$OLDPWD/crates/pml-python/tests/test_pml.py"
