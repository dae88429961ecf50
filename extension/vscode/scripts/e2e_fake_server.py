"""The scripted server of `scripts/e2e.sh --fake`: extension/nvim/tests/fake_server.py (its path
is the first argument) with, on top of it:

- pygls' debug log in $QD_E2E_SERVER_LOG (as the real server's `--log-level debug`: every
  message received, in order), and textDocument/didFocus logged with its params;
- next edits: `capabilities.experimental.inlineEdit`, and `textDocument/copilotInlineEdit`
  answered by a rule that finishes a rename, as the real server's model would: for the first
  pair OLD:NEW of $QD_FAKE_RENAMES (e.g. "width:breadth,height:depth~") whose NEW is already in
  the document and whose OLD is still in it, one edit per remaining OLD (whole words) replacing
  it by NEW. A pair marked `~` is answered only after $QD_FAKE_EDIT_SLOW_MS, even when the
  client cancelled the request meanwhile (the late answer a client must drop). Each request is
  logged ("inlineEdit"), each answer ("inlineEditAnswered", with whether it was cancelled),
  each textDocument/didShowInlineEdit ("didShowInlineEdit"); `$/quickdraft/stats` with
  feature "inlineEdit" follows each answer, as from the real server.
- in documents named rename.py, automatic inline completion requests get no suggestion (only an
  explicit Trigger Inline Suggestion does), so that the next edit and ghost text meet only
  where the test puts them together.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import sys
import time
from typing import Any

from lsprotocol import types
from pygls.capabilities import ServerCapabilitiesBuilder

logging.basicConfig(
    filename=os.environ["QD_E2E_SERVER_LOG"],
    level=logging.DEBUG,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
spec = importlib.util.spec_from_file_location("fake_server", sys.argv[1])
fake = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fake)
server = fake.server

INLINE_EDIT = "textDocument/copilotInlineEdit"
DID_SHOW_INLINE_EDIT = "textDocument/didShowInlineEdit"
RENAMES = [
    (old, new.rstrip("~"), new.endswith("~"))
    for old, _, new in (
        pair.partition(":")
        for pair in os.environ.get("QD_FAKE_RENAMES", "").split(",")
        if ":" in pair
    )
]
EDIT_SLOW_MS = int(os.environ.get("QD_FAKE_EDIT_SLOW_MS") or 0)
NO_AUTOMATIC_IN = "/rename.py"

_build = ServerCapabilitiesBuilder.build


def build_with_inline_edit(self: ServerCapabilitiesBuilder) -> types.ServerCapabilities:
    capabilities = _build(self)
    capabilities.experimental = {**(capabilities.experimental or {}), "inlineEdit": True}
    return capabilities


ServerCapabilitiesBuilder.build = build_with_inline_edit


if "textDocument/didFocus" not in server.protocol.fm.features:

    @server.feature("textDocument/didFocus")
    def did_focus(ls, params):
        position = getattr(params, "position", None)
        fake.log(
            "didFocus",
            {
                "uri": params.textDocument.uri,
                "position": position and {"line": position.line, "character": position.character},
            },
        )


def rename_edits(text: str, version: int, uri: str) -> tuple[list[dict[str, Any]], Any]:
    """The edits that finish the first rename begun in `text`, and the pair (old, new, slow)."""
    for old, new, slow in RENAMES:
        if re.search(rf"\b{re.escape(new)}\b", text) and re.search(rf"\b{re.escape(old)}\b", text):
            edits = [
                {
                    "text": new,
                    # ASCII documents: UTF-16 units are characters
                    "range": {
                        "start": {"line": line, "character": match.start()},
                        "end": {"line": line, "character": match.end()},
                    },
                    "textDocument": {"uri": uri, "version": version},
                }
                for line, content in enumerate(text.split("\n"))
                for match in re.finditer(rf"\b{re.escape(old)}\b", content)
            ]
            return edits, (old, new, slow)
    return [], None


async def wait_even_if_cancelled(seconds: float) -> bool:
    """Sleeps `seconds` whatever happens; True when the request was cancelled meanwhile."""
    cancelled = False
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            cancelled = True  # $/cancelRequest: answer anyway, late
    return cancelled


@server.feature(INLINE_EDIT)
async def inline_edit(ls, params):
    started = time.monotonic()
    plain = fake.as_plain(params)
    uri = plain["textDocument"]["uri"]
    version = plain["textDocument"]["version"]
    document = ls.workspace.get_text_document(uri)
    current = document.version == version
    edits, pair = rename_edits(document.source, version, uri) if current else ([], None)
    fake.log(
        "inlineEdit",
        {
            "params": plain,
            "documentVersion": document.version,
            "rename": pair and [pair[0], pair[1]],
            "edits": len(edits),
        },
    )
    cancelled = False
    if pair and pair[2] and EDIT_SLOW_MS:
        cancelled = await wait_even_if_cancelled(EDIT_SLOW_MS / 1000)
    fake.log(
        "inlineEditAnswered",
        {"version": version, "cancelled": cancelled, "edits": edits},
    )
    ls.protocol.notify(
        "$/quickdraft/stats",
        {  # the real server's field names
            "feature": "inlineEdit",
            "latencyMs": (time.monotonic() - started) * 1000 + 40,
            "tokens": 24,
            "tokensPerForward": 3.5,
            "targetForwards": 7,
            "editCount": len(edits),
            "copiedTokens": 20,
            "rejected": None,
            "regionLines": [0, 6],
        },
    )
    return {"edits": edits}


@server.feature(DID_SHOW_INLINE_EDIT)
def did_show_inline_edit(ls, params):
    fake.log("didShowInlineEdit", fake.as_plain(params))


_inline_completion = server.protocol.fm.features[types.TEXT_DOCUMENT_INLINE_COMPLETION]


async def inline_completion(params: types.InlineCompletionParams):
    automatic = params.context.trigger_kind == types.InlineCompletionTriggerKind.Automatic
    if automatic and params.text_document.uri.endswith(NO_AUTOMATIC_IN):
        return types.InlineCompletionList(items=[])
    return await _inline_completion(params)


server.protocol.fm.features[types.TEXT_DOCUMENT_INLINE_COMPLETION] = inline_completion

server.start_io()
