#!/usr/bin/env bash
# Installs OpenAI's official clients for the server's client test suite
# (crates/pml-server/tests/openai_client*.py, openai_client_node.cjs) and the load test: the
# Python package `openai` (PyPI) into a cached virtual environment, and the Node package `openai`
# (npm) into a cached folder. Idempotent: each part is skipped when the wanted version is there.
#
# Environment:
#   PML_HOME              cache root (default ~/.cache/pml); the venv is $PML_HOME/venv-openai,
#                         the Node package $PML_HOME/node-openai/node_modules/openai
#   OPENAI_VERSION        Python `openai` version (default 3.54.0)
#   AGENTS_VERSION        Python `openai-agents` version (default 0.24.0)
#   NODE_OPENAI_VERSION   Node `openai` version (default 7.57.0)
#   PYTHON                interpreter used to create the venv (default python3)
set -euo pipefail

PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
VENV="$PML_HOME/venv-openai"
VERSION="${OPENAI_VERSION:-3.54.0}"
AGENTS_VERSION="${AGENTS_VERSION:-0.24.0}"
NODE_VERSION="${NODE_OPENAI_VERSION:-7.57.0}"
NODE_PREFIX="$PML_HOME/node-openai"
PYTHON="${PYTHON:-python3}"

log() { printf '[setup-openai-client] %s\n' "$*"; }

if [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c "import sys, openai, jsonschema, importlib.metadata as m; sys.exit(openai.__version__ != '$VERSION' or m.version('openai-agents') != '$AGENTS_VERSION')" 2>/dev/null; then
    log "python openai $VERSION and openai-agents $AGENTS_VERSION already installed in $VENV"
else
    log "installing python openai $VERSION and openai-agents $AGENTS_VERSION into $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$VERSION" \
        "openai-agents==$AGENTS_VERSION" jsonschema
    "$VENV/bin/python" -c "import openai; print('[setup-openai-client] python openai', openai.__version__)"
fi

installed_node_version() {
    node -e "console.log(require('$NODE_PREFIX/node_modules/openai/package.json').version)" 2>/dev/null || true
}
if [ "$(installed_node_version)" = "$NODE_VERSION" ]; then
    log "node openai $NODE_VERSION already installed in $NODE_PREFIX"
else
    log "installing node openai $NODE_VERSION into $NODE_PREFIX"
    mkdir -p "$NODE_PREFIX"
    npm install --silent --no-audit --no-fund --prefix "$NODE_PREFIX" "openai@$NODE_VERSION"
    log "node openai $(installed_node_version)"
fi
