"""`textDocument/inlineCompletion` (LSP 3.18): the suggestion as ghost text.

Up to `decoding.candidates` items, the greedy suggestion first: editors cycle through them
(VS Code's Alt+] / Alt+[, Neovim 0.12's `vim.lsp.inline_completion.select()`). When the editor
asks by itself, the first is answered at once and the others are computed after it, for its
next request at the same place; asked for (triggerKind Invoked, what VS Code sends when one
cycles), the answer waits for them.

Each item carries a `command` (`quickdraft.acceptedCompletion`) that editors run after inserting
it (Neovim 0.12's vim.lsp.inline_completion, VS Code): it tells the server which suggestion
(its index) was accepted, so the completion that follows it is computed ahead if it is not
already (CompletionService.accepted). Its answer says which: "ready", "running", "started", or
why not.
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
    context = params.context
    invoked = (
        context is not None and context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    )
    answer = await ls.completions.complete(
        uri,
        params.position,
        feature=FEATURE,
        request_id=ls.protocol.msg_id,
        invoked=invoked,
    )
    if answer is None:
        return types.InlineCompletionList(items=[])
    items = []
    for index, suggestion in enumerate(answer.items):
        accepted = {
            "uri": uri,
            "line": answer.start.line,
            "character": answer.start.character,
            "text": suggestion.text,
            "index": index,
        }
        items.append(
            types.InlineCompletionItem(
                insert_text=suggestion.text,
                range=types.Range(start=answer.start, end=answer.end),
                command=types.Command(
                    title="quickdraft: suggestion accepted",
                    command=ACCEPTED_COMMAND,
                    arguments=[accepted],
                ),
            )
        )
    return types.InlineCompletionList(items=items)


def accepted_completion(ls: QuickdraftServer, arguments: Any) -> str:
    """`workspace/executeCommand` of an item's command: arguments `[{uri, line, character,
    text, index}]` as the item carried them (`index`, the item's place in its list, may be
    left out: 0)."""
    # pygls spreads the arguments, or passes them as one list, by version.
    if len(arguments) == 1 and isinstance(arguments[0], (list, tuple)):
        arguments = arguments[0]
    accepted = arguments[0] if arguments else None
    uri, text = param(accepted, "uri"), param(accepted, "text")
    line, character = param(accepted, "line"), param(accepted, "character")
    index = param(accepted, "index")
    index = 0 if index is None else index
    whole = all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (line, character, index)
    )
    if not (isinstance(uri, str) and isinstance(text, str) and whole):
        raise JsonRpcInvalidParams(
            f"{ACCEPTED_COMMAND} needs [{{uri, line, character, text, index}}], got"
            f" {list(arguments)!r}"
        )
    outcome = ls.completions.accepted(uri, line, character, text, index=index)
    ls.log(
        f"{ACCEPTED_COMMAND}: item {index + 1}, {len(text)} chars, accepted in {uri}; the next"
        f" one: {outcome}",
        "log",
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
