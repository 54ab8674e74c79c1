#!/usr/bin/env bash
# Installs OpenAI's official Python client (the `openai` package from PyPI) into a cached virtual
# environment, for the server's client test suite (crates/pml-server/tests/openai_client.py) and
# the load test. Idempotent: exits early when the venv already imports it at the wanted version.
#
# Environment:
#   PML_HOME         cache root (default ~/.cache/pml); the venv is $PML_HOME/venv-openai
#   OPENAI_VERSION   `openai` version to install (default 3.54.0)
#   PYTHON           interpreter used to create the venv (default python3)
set -euo pipefail

PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
VENV="$PML_HOME/venv-openai"
VERSION="${OPENAI_VERSION:-3.54.0}"
PYTHON="${PYTHON:-python3}"

log() { printf '[setup-openai-client] %s\n' "$*"; }

if [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c "import sys, openai, jsonschema; sys.exit(openai.__version__ != '$VERSION')" 2>/dev/null; then
    log "openai $VERSION already installed in $VENV; nothing to do"
    exit 0
fi
log "installing openai $VERSION into $VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$VERSION" jsonschema
"$VENV/bin/python" -c "import openai; print('[setup-openai-client] openai', openai.__version__)"
