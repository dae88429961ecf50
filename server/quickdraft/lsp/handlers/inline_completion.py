"""`textDocument/inlineCompletion` (LSP 3.18): the suggestion as ghost text.

Each item carries a `command` (`quickdraft.acceptedCompletion`) that editors run after inserting
it (Neovim 0.12's vim.lsp.inline_completion, VS Code): it tells the server the suggestion was
accepted, so the completion that follows it is computed ahead if it is not already
(CompletionService.accepted). Its answer says which: "ready", "running", "started", or why not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from quickdraft.lsp.params import param

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer

FEATURE = "inlineCompletion"
ACCEPTED_COMMAND = "quickdraft.acceptedCompletion"


async def inline_completion(
    ls: QuickdraftServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList:
    uri = params.text_document.uri
    answer = await ls.completions.complete(
        uri,
        params.position,
        feature=FEATURE,
        request_id=ls.protocol.msg_id,
    )
    if answer is None:
        return types.InlineCompletionList(items=[])
    accepted = {
        "uri": uri,
        "line": answer.start.line,
        "character": answer.start.character,
        "text": answer.text,
    }
    item = types.InlineCompletionItem(
        insert_text=answer.text,
        range=types.Range(start=answer.start, end=answer.end),
        command=types.Command(
            title="quickdraft: suggestion accepted", command=ACCEPTED_COMMAND, arguments=[accepted]
        ),
    )
    return types.InlineCompletionList(items=[item])


def accepted_completion(ls: QuickdraftServer, arguments: Any) -> str:
    """`workspace/executeCommand` of an item's command: arguments `[{uri, line, character,
    text}]` as the item carried them."""
    # pygls spreads the arguments, or passes them as one list, by version.
    if len(arguments) == 1 and isinstance(arguments[0], (list, tuple)):
        arguments = arguments[0]
    accepted = arguments[0] if arguments else None
    uri, text = param(accepted, "uri"), param(accepted, "text")
    line, character = param(accepted, "line"), param(accepted, "character")
    whole = all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (line, character)
    )
    if not (isinstance(uri, str) and isinstance(text, str) and whole):
        raise JsonRpcInvalidParams(
            f"{ACCEPTED_COMMAND} needs [{{uri, line, character, text}}], got {list(arguments)!r}"
        )
    outcome = ls.completions.accepted(uri, line, character, text)
    ls.log(
        f"{ACCEPTED_COMMAND}: {len(text)} chars accepted in {uri}; the next one: {outcome}", "log"
    )
    return outcome


def register(server: QuickdraftServer) -> None:
    # pygls advertises `inlineCompletionProvider` only when options are given.
    server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(
        inline_completion
    )

    # pygls lists the command in `executeCommandProvider`. (It reads the handler's annotations
    # at run time, hence the closure: QuickdraftServer is only a name for type checkers here.)
    def accepted(*arguments: Any) -> str:
        return accepted_completion(server, arguments)

    server.command(ACCEPTED_COMMAND)(accepted)
