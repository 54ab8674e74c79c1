#!/usr/bin/env bash
# Installs what the playground's browser test (crates/pml-server/tests/playground_browser.rs)
# drives: Debian's Chromium (apt, when /usr/bin/chromium is missing) and the npm package
# playwright-core, which speaks CDP to it, into a cached folder. Idempotent.
#
# Environment:
#   PML_HOME                 cache root (default ~/.cache/pml); the package goes to
#                            $PML_HOME/node-playwright/node_modules/playwright-core
#   PLAYWRIGHT_CORE_VERSION  (default 1.65.1)
set -euo pipefail

PML_HOME="${PML_HOME:-$HOME/.cache/pml}"
PREFIX="$PML_HOME/node-playwright"
VERSION="${PLAYWRIGHT_CORE_VERSION:-1.65.1}"

log() { printf '[setup-browser-test] %s\n' "$*"; }

if [ ! -x /usr/bin/chromium ]; then
    log "installing Debian's chromium"
    { apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }; } >/dev/null
fi
installed="$(node -e "console.log(require('$PREFIX/node_modules/playwright-core/package.json').version)" 2>/dev/null || true)"
if [ "$installed" = "$VERSION" ]; then
    log "playwright-core $VERSION already installed in $PREFIX"
else
    log "installing playwright-core $VERSION into $PREFIX"
    mkdir -p "$PREFIX"
    # The package only: it never downloads a browser of its own (Debian's is used).
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --silent --no-audit --no-fund \
        --prefix "$PREFIX" "playwright-core@$VERSION"
fi
