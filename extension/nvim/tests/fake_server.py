"""A scripted stand-in for `quickdraft serve`, for testing the editor plugins' own logic.

It answers `textDocument/inlineCompletion` with a fixed suggestion, so that accepting a word, a
line or everything can be checked exactly (the tiny random models of the real server produce
arbitrary text). Everything the client sends that matters to the plugins (initializationOptions,
didChangeConfiguration, each inline completion request, each textDocument/didFocus) is appended as a JSON line to
$QD_FAKE_LOG.

Environment:
  QD_FAKE_SUGGESTION  the text suggested after the cursor (default below)
  QD_FAKE_SUGGESTION_JSON  the same as a JSON string (for control characters in it)
  QD_FAKE_RANGE       "1": answer with a range that starts at the word before the cursor and an
                      insertText that repeats that word (as servers that replace do)
  QD_FAKE_LOG         where to log (optional)
  QD_FAKE_SLOW_MS     answer a request whose line ends with "slow" only after this many ms; a
                      request cancelled meanwhile ($/cancelRequest) is logged as "cancelled"
  QD_FAKE_LOADING_MS  after `initialized`, report loading (work-done progress and
                      `$/quickdraft/status` "loading") for this many ms, then "ready"
  QD_FAKE_POSITION_ENCODING  negotiate this position encoding ("utf-16", "utf-32") instead of
                      the first the client offers (Neovim offers utf-8 first)
  QD_FAKE_INLINE_EDIT "1": offer next edits (capabilities.experimental.inlineEdit) and answer
                      textDocument/copilotInlineEdit with one edit (the first `add` of the
                      document becomes `plus`) for the version asked, or for the version before
                      it when the document holds "STALE"; each request and didShowInlineEdit is
                      logged, and `$/quickdraft/stats` sent with feature "inlineEdit"
  QD_FAKE_STDERR      "1": write STDERR_LINES to stderr at the start (log records at their
                      levels, lines without a level, a traceback), as the real server's stderr

A line ending with "choose" is answered as the real server answers a place it has candidates
for: an automatic request gets one item, an explicit one (triggerKind Invoked) three; each item's
command is `quickdraft.acceptedCompletion` with its index, logged as "accepted" when run.

Commands (workspace/executeCommand), for scenarios that script the server's side:
  fake.notify [method, params]   send that notification
  fake.createProgress [token]    send window/workDoneProgress/create for that token
  fake.progress [token, value]   send $/progress for it (value: kind, title, message, percentage)

The real end-to-end test runs the real server; this one only isolates the editor side.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

from lsprotocol import types
from pygls.capabilities import ServerCapabilitiesBuilder
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

SUGGESTION = (
    json.loads(os.environ["QD_FAKE_SUGGESTION_JSON"])
    if os.environ.get("QD_FAKE_SUGGESTION_JSON")
    else os.environ.get("QD_FAKE_SUGGESTION", "total = add(first, second)\nprint(total)")
)
USE_RANGE = os.environ.get("QD_FAKE_RANGE") == "1"
LOG = os.environ.get("QD_FAKE_LOG")
SLOW_MS = int(os.environ.get("QD_FAKE_SLOW_MS") or 0)
LOADING_MS = int(os.environ.get("QD_FAKE_LOADING_MS") or 0)
STATUS = "$/quickdraft/status"
POSITION_ENCODING = os.environ.get("QD_FAKE_POSITION_ENCODING")
DID_FOCUS = "textDocument/didFocus"
INLINE_EDIT = os.environ.get("QD_FAKE_INLINE_EDIT") == "1"

if POSITION_ENCODING:
    ServerCapabilitiesBuilder.choose_position_encoding = classmethod(
        lambda cls, capabilities: POSITION_ENCODING
    )


class FakeProtocol(LanguageServerProtocol):
    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        result = yield from super().lsp_initialize(params)
        if INLINE_EDIT:
            result.capabilities.experimental = {"inlineEdit": True}
        return result


server = LanguageServer("quickdraft-fake", "0.0.1", protocol_cls=FakeProtocol)

# What the real server's stderr looks like (format of server/quickdraft/lsp/cli.py
# configure_logging), with llama.cpp's load warning, lines that carry no level and a traceback.
STDERR_LINES = [
    "2026-12-01 10:00:00,123 WARNING quickdraft.decoding.llamacpp: llama.cpp: load: "
    "control-looking token: 128247 '</s>' was not control-type; this is probably a bug in the "
    "model. its type will be overridden",
    "  a line that continues the warning",
    "2026-12-01 10:00:00,200 INFO quickdraft.lsp.server: loading: loading models",
    "llama_model_loader: loaded meta data with 29 key-value pairs",
    "Traceback (most recent call last):",
    '  File "fake_server.py", line 1, in <module>',
    "ValueError: a failure for the test",
]


def log(event: str, data: object) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"event": event, "data": data}) + "\n")


@server.feature(types.INITIALIZE)
def initialize(ls: LanguageServer, params: types.InitializeParams) -> None:
    log("initialize", params.initialization_options)


@server.feature(types.INITIALIZED)
async def initialized(ls: LanguageServer, params: types.InitializedParams) -> None:
    log("initialized", None)
    if LOADING_MS > 0:
        asyncio.ensure_future(load(ls))


async def load(ls: LanguageServer) -> None:
    """What the real server reports while its models load: progress, then "ready"."""
    token = "quickdraft-fake-load"
    await ls.work_done_progress.create_async(token)
    ls.work_done_progress.begin(
        token, types.WorkDoneProgressBegin(title="quickdraft", message="loading", percentage=0)
    )
    ls.protocol.notify(STATUS, {"state": "loading", "message": "loading the fake models"})
    log("status", "loading")
    await asyncio.sleep(LOADING_MS / 2000)
    ls.work_done_progress.report(
        token, types.WorkDoneProgressReport(message="calibrating", percentage=50)
    )
    ls.protocol.notify(STATUS, {"state": "loading", "message": "calibrating the fake models"})
    await asyncio.sleep(LOADING_MS / 2000)
    ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message="ready"))
    ls.protocol.notify(STATUS, {"state": "ready", "message": "", "backend": "local"})
    log("status", "ready")


CHOICES = ("choice_one()", "choice_two()", "choice_three()")


@server.command("quickdraft.acceptedCompletion")
def fake_accepted(ls: LanguageServer, *arguments: Any) -> str:
    accepted = arguments[0] if arguments else {}
    if isinstance(accepted, list):
        accepted = accepted[0] if accepted else {}
    log("accepted", {"text": accepted.get("text"), "index": accepted.get("index")})
    return "ready"


@server.command("fake.notify")
def fake_notify(ls: LanguageServer, method: str, params: Any = None) -> None:
    ls.protocol.notify(method, params)


@server.command("fake.createProgress")
async def fake_create_progress(ls: LanguageServer, token: str) -> None:
    await ls.work_done_progress.create_async(token)


@server.command("fake.progress")
def fake_progress(ls: LanguageServer, token: str, value: dict[str, Any]) -> None:
    fields = {key: value[key] for key in ("title", "message", "percentage") if key in value}
    if value["kind"] == "begin":
        ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(**fields))
    elif value["kind"] == "report":
        fields.pop("title", None)
        ls.work_done_progress.report(token, types.WorkDoneProgressReport(**fields))
    else:
        ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=fields.get("message")))


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def did_change_configuration(
    ls: LanguageServer, params: types.DidChangeConfigurationParams
) -> None:
    log("didChangeConfiguration", params.settings)


def as_plain(value: Any) -> Any:
    """The params of a method pygls does not know (namedtuples) as plain JSON values."""
    if hasattr(value, "_asdict"):
        return {key: as_plain(item) for key, item in value._asdict().items()}
    if isinstance(value, list | tuple):
        return [as_plain(item) for item in value]
    return value


@server.feature(DID_FOCUS)
def did_focus(ls: LanguageServer, params: Any) -> None:
    """Logs the params as sent, with the text of the line before `position` as this server reads
    it in the negotiated encoding (the text before the cursor, when the client encodes as agreed).
    """
    plain = as_plain(params)
    encoding = ls.workspace.position_encoding
    entry: dict[str, Any] = {
        "params": plain,
        "encoding": getattr(encoding, "value", encoding),
    }
    position = plain.get("position")
    if position is not None:
        document = ls.workspace.get_text_document(plain["textDocument"]["uri"])
        line = position["line"]
        start = document.offset_at_position(types.Position(line, 0))
        end = document.offset_at_position(types.Position(line, position["character"]))
        entry["prefix"] = document.source[start:end]
    log("didFocus", entry)


def copilot_inline_edit(ls: LanguageServer, params: Any) -> dict[str, Any]:
    plain = as_plain(params)
    uri, version = plain["textDocument"]["uri"], plain["textDocument"]["version"]
    position = plain["position"]
    document = ls.workspace.get_text_document(uri)
    log(
        "copilotInlineEdit",
        {"version": version, "line": position["line"], "character": position["character"]},
    )
    ls.protocol.notify(
        "$/quickdraft/stats",
        {
            "feature": "inlineEdit",
            "latencyMs": 42.0,
            "tokens": 8,
            "tokensPerForward": 2.5,
            "editCount": 1,
            "copiedTokens": 6,
            "rejected": None,
        },
    )
    for line, text in enumerate(document.lines):
        column = text.find("add")
        if column >= 0:
            answered = version - 1 if "STALE" in document.source else version
            end = {"line": line, "character": column + 3}
            return {
                "edits": [
                    {
                        "text": "plus",
                        "range": {"start": {"line": line, "character": column}, "end": end},
                        "textDocument": {"uri": uri, "version": answered},
                    }
                ]
            }
    return {"edits": []}


def did_show_inline_edit(ls: LanguageServer, params: Any) -> None:
    log("didShowInlineEdit", as_plain(params))


# Next edits only when offered: a server built on this one (extension/vscode/scripts/
# e2e_fake_server.py) registers its own, and pygls refuses a feature registered twice.
if INLINE_EDIT:
    server.feature("textDocument/copilotInlineEdit")(copilot_inline_edit)
    server.feature("textDocument/didShowInlineEdit")(did_show_inline_edit)


@server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
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
    if SLOW_MS and prefix.endswith("slow"):
        try:
            await asyncio.sleep(SLOW_MS / 1000)
        except asyncio.CancelledError:
            log("cancelled", {"line": params.position.line, "prefix": prefix})
            raise
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
    if prefix.endswith("choose"):
        invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        texts = CHOICES if invoked else CHOICES[:1]
        return types.InlineCompletionList(
            items=[
                types.InlineCompletionItem(
                    insert_text=text,
                    # Empty at the cursor, as the real server's: without one VS Code replaces
                    # the word at the cursor (and hides items that do not start with it).
                    range=types.Range(params.position, params.position),
                    command=types.Command(
                        title="accepted",
                        command="quickdraft.acceptedCompletion",
                        arguments=[{"text": text, "index": index}],
                    ),
                )
                for index, text in enumerate(texts)
            ]
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
    if os.environ.get("QD_FAKE_STDERR") == "1":
        # in parts, as a pipe may deliver them: the client must join them into lines
        text = "\n".join(STDERR_LINES) + "\n"
        for start in range(0, len(text), 37):
            sys.stderr.write(text[start : start + 37])
            sys.stderr.flush()
    server.start_io()
