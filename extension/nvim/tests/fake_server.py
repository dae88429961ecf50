"""A scripted stand-in for `quickdraft serve`, for testing the editor plugins' own logic.

It answers `textDocument/inlineCompletion` with a fixed suggestion, so that accepting a word, a
line or everything can be checked exactly (the tiny random models of the real server produce
arbitrary text). Everything the client sends that matters to the plugins (initializationOptions,
didChangeConfiguration, each inline completion request) is appended as a JSON line to
$QD_FAKE_LOG.

Environment:
  QD_FAKE_SUGGESTION  the text suggested after the cursor (default below)
  QD_FAKE_RANGE       "1": answer with a range that starts at the word before the cursor and an
                      insertText that repeats that word (as servers that replace do)
  QD_FAKE_LOG         where to log (optional)

The real end-to-end test runs the real server; this one only isolates the editor side.
"""

from __future__ import annotations

import json
import os
import re

from lsprotocol import types
from pygls.lsp.server import LanguageServer

SUGGESTION = os.environ.get("QD_FAKE_SUGGESTION", "total = add(first, second)\nprint(total)")
USE_RANGE = os.environ.get("QD_FAKE_RANGE") == "1"
LOG = os.environ.get("QD_FAKE_LOG")

server = LanguageServer("quickdraft-fake", "0.0.1")


def log(event: str, data: object) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"event": event, "data": data}) + "\n")


@server.feature(types.INITIALIZE)
def initialize(ls: LanguageServer, params: types.InitializeParams) -> None:
    log("initialize", params.initialization_options)


@server.feature(types.INITIALIZED)
def initialized(ls: LanguageServer, params: types.InitializedParams) -> None:
    log("initialized", None)


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def did_change_configuration(
    ls: LanguageServer, params: types.DidChangeConfigurationParams
) -> None:
    log("didChangeConfiguration", params.settings)


@server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
def inline_completion(
    ls: LanguageServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList:
    document = ls.workspace.get_text_document(params.text_document.uri)
    line = (
        document.lines[params.position.line] if params.position.line < len(document.lines) else ""
    )
    # positions are UTF-16 by default; the tests type ASCII
    prefix = line[: params.position.character]
    log(
        "inlineCompletion",
        {
            "line": params.position.line,
            "character": params.position.character,
            "prefix": prefix,
            "trigger": int(params.context.trigger_kind),
        },
    )
    ls.protocol.notify(
        "$/quickdraft/stats",
        {  # the real server's field names
            "latencyMs": 12.5,
            "tokens": 10,
            "tokensPerForward": 2.5,
            "acceptedBySource": {"ngram": 4, "draft": 2},
            "draftedBySource": {"ngram": 5, "draft": 3},
        },
    )
    if USE_RANGE:
        word = re.search(r"[A-Za-z_]*$", prefix).group(0)
        start = types.Position(params.position.line, params.position.character - len(word))
        return types.InlineCompletionList(
            items=[
                types.InlineCompletionItem(
                    insert_text=word + SUGGESTION,
                    range=types.Range(start, params.position),
                )
            ]
        )
    return types.InlineCompletionList(items=[types.InlineCompletionItem(insert_text=SUGGESTION)])


@server.feature(types.TEXT_DOCUMENT_COMPLETION)
def completion(ls: LanguageServer, params: types.CompletionParams) -> types.CompletionList:
    return types.CompletionList(
        is_incomplete=False,
        items=[
            types.CompletionItem(
                label=SUGGESTION.split("\n")[0], kind=types.CompletionItemKind.Text
            )
        ],
    )


if __name__ == "__main__":
    server.start_io()
