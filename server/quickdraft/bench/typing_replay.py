"""`quickdraft bench --typing`: typing sessions replayed through the real language server.

For every variant (prompt layout x strategy x work ahead on/off) a fresh `quickdraft serve` runs
as a subprocess with the bench's model flags, and this module talks to it over stdio exactly as
VS Code does (lsp_client.py): `initialize` with the settings tree as `initializationOptions`,
`didOpen`, incremental `didChange` with UTF-16 ranges and versions, an automatic
`textDocument/inlineCompletion` after every edit, and `$/cancelRequest` for a request still
open when the next keystroke comes.

Each hole (sample_holes: the rest of a line, or the first lines of a block) is replayed as:

1. open the hole's other files and the document without the hidden text; ask at the cursor: the
   cold request;
2. type the hidden text one character a keystroke, every `pace` ms (or, with `await_answers`,
   after each answer), pressing Enter at the end of each line with the indentation an editor
   inserts (and fixing it in one more keystroke when the file's own differs), then Enter once more
   after the last line;
3. accept the suggestion shown after that Enter (a didChange inserting it, as Tab does), wait one
   cold-request time, ask again (`accept-wait`);
4. ask once in another open file (`other-file`), come back and ask at the same spot
   (`back-same`), then press Enter and ask (`back-enter`);
5. accept that suggestion and ask at once (`accept-now`);
6. close everything.

Every request is recorded with when it was answered or superseded, the `$/quickdraft/stats`
the server sent for it (matched by `requestId`), and whether its suggestion agreed with the
hidden text. results.json is rewritten after every hole, so a crash or an interrupt keeps what
was measured; report.md and the plot come from typing_report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from quickdraft.bench import typing_report
from quickdraft.bench.holes import Hole
from quickdraft.bench.lsp_client import Request, StdioLspClient
from quickdraft.bench.provenance import provenance
from quickdraft.errors import ConfigError, LanguageServerError
from quickdraft.lsp.documents import UTF16, Document, units
from quickdraft.models.store import write_json_atomic

PREFIX = "quickdraft bench --typing"
LAYOUTS = ("append", "classic")
WORK_AHEAD = {"on": True, "off": False}
DEFAULT_HOLES = 4
QUICK_HOLES = 2
HOLE_KINDS = ("line", "block")
WARMUP_URI = "file:///quickdraft-bench/warmup.py"
WARMUP_TEXT = "def add(a, b):\n    return "
SETTLE_S = 30.0
"""How long the answers still owed at the end of a hole are waited for before they count as
unanswered."""
OPENERS = (":", "{", "[", "(")

# VS Code's client capabilities, as far as the server can see them.
CLIENT_CAPABILITIES: dict[str, Any] = {
    "general": {"positionEncodings": ["utf-16"]},
    "textDocument": {
        "synchronization": {
            "dynamicRegistration": True,
            "willSave": True,
            "willSaveWaitUntil": True,
            "didSave": True,
        },
        "completion": {
            "dynamicRegistration": True,
            "contextSupport": True,
            "completionItem": {"snippetSupport": True, "labelDetailsSupport": True},
        },
        "inlineCompletion": {"dynamicRegistration": True},
    },
    "workspace": {
        "configuration": True,
        "didChangeConfiguration": {"dynamicRegistration": True},
        "workspaceFolders": True,
    },
    "window": {
        "workDoneProgress": True,
        "showMessage": {"messageActionItem": {"additionalPropertiesSupport": True}},
    },
}


# --- variants -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    layout: str
    strategy: str
    work_ahead: bool

    @property
    def name(self) -> str:
        return f"{self.layout}/{self.strategy}/ahead-{'on' if self.work_ahead else 'off'}"

    def settings(self) -> dict[str, Any]:
        """The part of the settings tree this variant sets."""
        return {
            "context": {"layout": self.layout},
            "cache": {"warmup": self.work_ahead, "prefetch": self.work_ahead},
            "decoding": {"strategy": self.strategy},
        }


def _names(value: str | None, default: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    names = [n.strip() for n in (value or default).split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise ConfigError(
            f"{flag}: unknown {', '.join(unknown) or 'empty list'} (known: {', '.join(allowed)})"
        )
    return list(dict.fromkeys(names))


def parse_variants(
    layouts: str | None, strategies: str | None, work_ahead: str | None
) -> list[Variant]:
    """Every combination of the comma-separated choices, layouts outermost."""
    from quickdraft.config import STRATEGIES

    chosen_layouts = _names(layouts, ",".join(LAYOUTS), LAYOUTS, "--typing-layouts")
    chosen_strategies = _names(strategies, "ar,hybrid", STRATEGIES, "--strategies")
    ahead = _names(work_ahead, "on,off", tuple(WORK_AHEAD), "--typing-work-ahead")
    return [
        Variant(layout, strategy, WORK_AHEAD[on])
        for layout in chosen_layouts
        for strategy in chosen_strategies
        for on in ahead
    ]


def merge_settings(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` laid over `base`, section by section (neither is modified)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_settings(merged[key], value)
        else:
            merged[key] = value
    return merged


# --- what the editor does -------------------------------------------------------------------


@dataclass(frozen=True)
class Keystroke:
    kind: str
    """`char`, `enter` (a line break and the indentation the editor adds) or `indent` (the
    indentation put right in one go, as Tab or Backspace do)."""
    delete: int
    """Characters before the cursor it replaces."""
    insert: str
    done: int
    """Characters of the hidden text in the document once it is typed."""
    comparable: bool
    """The text before the cursor is then the file's own, so a suggestion can be judged."""


def leading_whitespace(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def guess_indent_unit(text: str) -> str:
    """What the editor inserts for one level of indentation in `text` (tab, or 2-8 spaces)."""
    tabs = spaces = 0
    steps: dict[int, int] = {}
    previous = 0
    for line in text.split("\n"):
        if not line.strip():
            continue
        indent = leading_whitespace(line)
        if indent.startswith("\t"):
            tabs += 1
            continue
        if indent:
            spaces += 1
        width = len(indent)
        if 2 <= width - previous <= 8:
            steps[width - previous] = steps.get(width - previous, 0) + 1
        previous = width
    if tabs > spaces:
        return "\t"
    if not steps:
        return "    "
    return " " * max(steps, key=lambda step: (steps[step], -step))


def auto_indent(line: str, unit: str) -> str:
    """The indentation an editor puts on the new line when Enter is pressed at the end of
    `line`: the line's own, one level more after an opening bracket or a colon."""
    base = leading_whitespace(line)
    return base + unit if line.rstrip().endswith(OPENERS) else base


def plan_keystrokes(truth: str, line_before: str, unit: str) -> list[Keystroke]:
    """The keystrokes that type `truth` after `line_before` (the cursor line up to the cursor),
    then press Enter once more."""
    keys: list[Keystroke] = []
    current = line_before
    position = 0
    for number, line in enumerate(truth.split("\n")):
        column = 0
        if number:
            auto, actual = auto_indent(current, unit), leading_whitespace(line)
            fits = actual.startswith(auto)
            keys.append(
                Keystroke("enter", 0, "\n" + auto, position + len(auto) if fits else position, fits)
            )
            if auto != actual:
                keys.append(Keystroke("indent", len(auto), actual, position + len(actual), True))
            column = len(actual)
            current = ""
        for char in line[column:]:
            column += 1
            keys.append(Keystroke("char", 0, char, position + column, True))
        current += line
        position += len(line) + 1
    keys.append(Keystroke("enter", 0, "\n" + auto_indent(current, unit), len(truth), False))
    return keys


def typing_truth(truth: str, max_lines: int) -> str:
    """The part of a hole's hidden text that is typed: its first `max_lines` lines."""
    return "\n".join(truth.split("\n")[:max_lines]).rstrip()


def suggestion_matches(suggestion: str, remaining: str) -> bool:
    """The suggestion agrees with what is typed next: it is the start of the remaining hidden
    text, or the rest of the hidden text's line is the start of the suggestion."""
    body = suggestion.rstrip()
    if not body.strip():
        return False
    rest_of_line = remaining.split("\n", 1)[0].rstrip()
    return remaining.startswith(body) or bool(rest_of_line) and body.startswith(rest_of_line)


def other_file_spot(text: str) -> int:
    """Where the bench asks in another open file: the end of its middle non-blank line."""
    lines = text.split("\n")
    filled = [n for n, line in enumerate(lines) if line.strip()]
    if not filled:
        return 0
    number = filled[len(filled) // 2]
    return sum(len(line) + 1 for line in lines[:number]) + len(lines[number].rstrip("\r"))


class EditorDocument:
    """The editor's copy of one open document; every edit becomes VS Code's didChange."""

    def __init__(self, uri: str, language: str, text: str) -> None:
        self.document = Document(uri, text, language, 1, UTF16)

    @property
    def uri(self) -> str:
        return self.document.uri

    @property
    def text(self) -> str:
        return self.document.text

    def position(self, offset: int) -> dict[str, int]:
        line, character = self.document.position_at(offset)
        return {"line": line, "character": character}

    def offset(self, position: dict[str, int]) -> int:
        return self.document.offset_at(position["line"], position["character"], strict=False)

    def did_open(self) -> dict[str, Any]:
        doc = self.document
        return {
            "textDocument": {
                "uri": doc.uri,
                "languageId": doc.language_id,
                "version": doc.version,
                "text": doc.text,
            }
        }

    def edit(self, start: int, end: int, text: str) -> dict[str, Any]:
        """Replace `start`..`end` (code point offsets) with `text`: the didChange params."""
        replaced = self.text[start:end]
        change = {
            "range": {"start": self.position(start), "end": self.position(end)},
            "rangeLength": units(replaced),
            "text": text,
        }
        self.document.text = self.text[:start] + text + self.text[end:]
        self.document._line_starts = None
        self.document.version += 1
        return {
            "textDocument": {"uri": self.uri, "version": self.document.version},
            "contentChanges": [change],
        }


def inline_params(doc: EditorDocument, offset: int) -> dict[str, Any]:
    """`textDocument/inlineCompletion` as VS Code sends it while the user types."""
    return {
        "context": {"triggerKind": 2},  # InlineCompletionTriggerKind.Automatic
        "textDocument": {"uri": doc.uri},
        "position": doc.position(offset),
    }


def first_item(result: Any) -> dict[str, Any] | None:
    items = result.get("items") if isinstance(result, dict) else result
    if not items:
        return None
    item = items[0]
    return item if isinstance(item, dict) else None


def item_text(item: dict[str, Any]) -> str:
    text = item.get("insertText", "")
    return text.get("value", "") if isinstance(text, dict) else str(text or "")


# --- the server -----------------------------------------------------------------------------


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class TypingServer:
    """One `quickdraft serve` for one variant, started and initialized as VS Code does."""

    def __init__(
        self, command: list[str], settings: dict[str, Any], log_path: Path, say, *, root: Path
    ) -> None:
        self.settings = settings
        self.say = say
        self.root = root
        self.stats: dict[Any, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.status: dict[str, Any] | None = None
        self.models: dict[str, Any] | None = None
        self.client = StdioLspClient(
            command,
            log_path=log_path,
            env=server_env(),
            notifications=self._notified,
            settings=settings,
        )

    def _notified(self, method: str, params: Any, received: float) -> None:
        params = params if isinstance(params, dict) else {}
        if method == "$/quickdraft/stats":
            self.stats[params.get("requestId")] = params
        elif method == "window/logMessage":
            message = str(params.get("message", ""))
            if message.startswith(("models ready", "loading models")):
                self.say(f"  server: {message}")
        elif method == "window/showMessage":
            message = str(params.get("message", ""))
            if params.get("type") == 1:
                self.errors.append(message)
            self.say(f"  server says: {message}")
        elif method == "$/quickdraft/status":
            self.status = params
            if isinstance(params.get("models"), dict):
                self.models = params["models"]
            self.say(f"  server status: {params.get('state')}: {params.get('message', '')}")
            if params.get("state") == "error":
                self.errors.append(str(params.get("message") or "the server reported an error"))
        elif method == "$/progress":
            value = params.get("value") or {}
            text = " ".join(str(value.get(k)) for k in ("title", "message") if value.get(k))
            if text:
                self.say(f"  server progress: {text}")

    async def start(self, load_timeout: float) -> None:
        await self.client.start()
        root_uri = self.root.resolve().as_uri()
        initialize = self.client.request(
            "initialize",
            {
                "processId": os.getpid(),
                "clientInfo": {"name": "quickdraft bench --typing", "version": "1"},
                "rootUri": root_uri,
                "workspaceFolders": [{"uri": root_uri, "name": self.root.name}],
                "capabilities": CLIENT_CAPABILITIES,
                "initializationOptions": self.settings,
                "trace": "off",
            },
        )
        answer = await self.client.wait(initialize, load_timeout, what="initialize")
        if answer.error:
            raise LanguageServerError(f"initialize failed: {answer.error.get('message')}")
        self.client.notify("initialized", {})

    def fatal(self) -> str | None:
        """Why the server cannot serve completions, once it has said so."""
        for message in self.errors:
            if "could not load models" in message or "invalid configuration" in message:
                return message
        if self.status and self.status.get("state") == "error":
            return str(self.status.get("message") or "the server reported an error")
        return None

    async def warm_up(self, load_timeout: float) -> float:
        """One untimed request that waits for the models to load; returns the seconds it took."""
        doc = EditorDocument(WARMUP_URI, "python", WARMUP_TEXT)
        self.client.notify("textDocument/didOpen", doc.did_open())
        started = time.perf_counter()
        request = self.client.request(
            "textDocument/inlineCompletion", inline_params(doc, len(WARMUP_TEXT))
        )

        def heartbeat(waited: float) -> None:
            self.say(f"  still waiting for the models to load in the server ({waited:.0f} s)…")

        await self.client.wait(
            request, load_timeout, what="the first request (models loading)", heartbeat=heartbeat
        )
        self.client.notify("textDocument/didClose", {"textDocument": {"uri": doc.uri}})
        reason = self.fatal()
        if reason:
            raise LanguageServerError(
                f"the server cannot serve: {reason} (log: {self.client.log_path})"
            )
        return time.perf_counter() - started

    async def close(self) -> None:
        await self.client.close()


# --- the replay -----------------------------------------------------------------------------


@dataclass
class TypingOptions:
    repo: Path
    out: Path
    variants: list[Variant]
    server_command: list[str]
    """`python -m quickdraft.cli serve` and the model flags, without settings."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The settings tree every variant starts from (each lays its own over it)."""
    pace_ms: float = 120.0
    await_answers: bool = False
    max_lines: int = 3
    request_timeout_s: float = 600.0
    load_timeout_s: float = 1800.0
    progress: bool = True


@dataclass
class _Live:
    """A request of the current hole and what the bench knew when it sent it."""

    record: dict[str, Any]
    request: Request
    doc: EditorDocument
    offset: int
    remaining: str | None
    item: dict[str, Any] | None = None
    taken: bool = False


class TypingBench:
    def __init__(self, holes: list[Hole], options: TypingOptions) -> None:
        self.holes = holes
        self.options = options
        self.out = options.out
        self.env = self._environment()
        self.variants: dict[str, dict[str, Any]] = {}
        self.server: TypingServer | None = None
        self._live: list[_Live] = []
        self._hole_index = 0
        self._clock = time.perf_counter()

    # --- output ---------------------------------------------------------------------------

    def say(self, message: str) -> None:
        print(f"{PREFIX}: {message}" if not message.startswith(" ") else message, file=sys.stderr)

    def _environment(self) -> dict[str, Any]:
        options = self.options
        return {
            **provenance(),
            "repo": str(options.repo),
            "holes": [hole.to_dict() for hole in self.holes],
            "server_command": options.server_command,
            "settings": options.settings,
            "pace_ms": options.pace_ms,
            "await_answers": options.await_answers,
            "max_lines": options.max_lines,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "interrupted": False,
        }

    def results(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "variants": self.variants,
            "summary": {
                name: typing_report.summarize_variant(variant)
                for name, variant in self.variants.items()
            },
        }

    def write(self, *, final: bool) -> dict[str, Any]:

        self.out.mkdir(parents=True, exist_ok=True)
        if final:
            self.env["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        results = self.results()
        write_json_atomic(self.out / "results.json", results)
        if final:
            plots = typing_report.write_plot(self.out, results)
            (self.out / "report.md").write_text(
                typing_report.render_markdown(results, plots), encoding="utf-8"
            )
        return results

    # --- running --------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Every variant in turn; results written as they come, and at the end in any case."""
        try:
            asyncio.run(self._run_all())
        except KeyboardInterrupt:
            self.env["interrupted"] = True
            if self.server is not None:
                self.server.client.kill()
            self.write(final=True)
            raise
        return self.write(final=True)

    async def _run_all(self) -> None:
        for number, variant in enumerate(self.options.variants, 1):
            await self._run_variant(number, variant)

    async def _run_variant(self, number: int, variant: Variant) -> None:
        options = self.options
        total = len(options.variants)
        settings = merge_settings(options.settings, variant.settings())
        record: dict[str, Any] = {
            "settings": settings,
            "server": {},
            "error": None,
            "holes": [],
            "requests": [],
        }
        self.variants[variant.name] = record
        slug = variant.name.replace("/", "-")
        log_path = self.out / "logs" / f"serve-{number}-{slug}.log"
        self.say(
            f"variant {number}/{total} {variant.name}: starting quickdraft serve (log: {log_path})"
        )
        command = [*options.server_command, "--log-level", "info"]
        server = TypingServer(command, settings, log_path, self.say, root=options.repo)
        self.server = server
        started = time.perf_counter()
        try:
            self.say("  loading models and warming up (the first request waits for them)…")
            await server.start(options.load_timeout_s)
            record["server"]["warmup_s"] = round(await server.warm_up(options.load_timeout_s), 3)
            record["server"].update(self._server_facts(server))
            self.say(
                f"  ready after {time.perf_counter() - started:.1f} s: runtime "
                f"{record['server']['runtime']}, dtype {record['server']['dtype']}, "
                f"device {record['server']['device']}"
            )
            for index, hole in enumerate(self.holes):
                await self._run_hole(record, index, hole)
                self.write(final=False)
        except LanguageServerError as exc:
            record["error"] = str(exc)
            self.say(f"  variant {variant.name} stopped: {exc}")
            self._finish_requests(record)
        finally:
            record["server"].setdefault("log", str(log_path))
            record["server"]["errors"] = list(server.errors)  # what the user was shown
            await server.close()
            record["server"]["exit_status"] = server.client.returncode
            self.server = None
            self.write(final=False)

    def _server_facts(self, server: TypingServer) -> dict[str, Any]:
        models = server.models or {}
        runtime = models.get("runtime")
        return {
            "models": models,
            "runtime": runtime or "torch (not named by the server)",
            "dtype": models.get("dtype"),
            "device": models.get("device"),
            "server_requests": list(server.client.server_requests),
        }

    # --- one hole ---------------------------------------------------------------------------

    async def _run_hole(self, record: dict[str, Any], index: int, hole: Hole) -> None:
        client = self.server.client  # type: ignore[union-attr]
        truth = typing_truth(hole.truth, self.options.max_lines)
        total = len(self.holes)
        self.say(
            f"  hole {index + 1}/{total} {hole.file}:{hole.line + 1} ({hole.kind}, "
            f"{len(truth)} characters to type, {len(hole.open_files)} other files open)"
        )
        hole_record: dict[str, Any] = {
            "index": index,
            "file": hole.file,
            "line": hole.line,
            "kind": hole.kind,
            "typed": truth,
            "other_files": [other.file for other in hole.open_files],
        }
        record["holes"].append(hole_record)
        self._hole_index = index
        others = [EditorDocument(o.uri, o.language, o.text) for o in hole.open_files]
        doc = EditorDocument(hole.uri, hole.language, hole.text)
        for opened in [*others, doc]:
            client.notify("textDocument/didOpen", opened.did_open())
        try:
            cursor = hole.offset
            cold = await self._ask_and_wait(doc, cursor, "cold", remaining=hole.truth)
            cold_ms = cold.record["latency_ms"]
            hole_record["cold_ms"] = cold_ms

            line_start = doc.text.rfind("\n", 0, cursor) + 1
            keys = plan_keystrokes(truth, doc.text[line_start:cursor], guess_indent_unit(doc.text))
            cursor, last = await self._type(doc, cursor, keys, hole.truth)

            # Accept then continue: Tab on the suggestion after the last Enter, wait one
            # cold-request time, ask.
            cursor = await self._accept_and_ask(
                doc, cursor, last, "accept-wait", cold_ms, hole_record
            )

            # Another file, then back: the same spot, then Enter.
            latest = None
            if others:
                other = others[0]
                await self._ask_and_wait(other, other_file_spot(other.text), "other-file")
                await self._ask_and_wait(doc, cursor, "back-same")
                line_start = doc.text.rfind("\n", 0, cursor) + 1
                enter = "\n" + auto_indent(doc.text[line_start:cursor], guess_indent_unit(doc.text))
                client.notify("textDocument/didChange", doc.edit(cursor, cursor, enter))
                cursor += len(enter)
                latest = await self._ask_and_wait(doc, cursor, "back-enter")

            # Tab on that suggestion, and ask at once.
            await self._accept_and_ask(doc, cursor, latest, "accept-now", 0.0, hole_record)
        finally:
            if not client.exited:
                for opened in [*others, doc]:
                    client.notify("textDocument/didClose", {"textDocument": {"uri": opened.uri}})
        await self._settle()
        self._finish_requests(record)
        self.say("    " + typing_report.hole_line(record["requests"], index))

    async def _type(
        self, doc: EditorDocument, cursor: int, keys: list[Keystroke], truth: str
    ) -> tuple[int, _Live | None]:
        """Type `keys`; return the cursor and the last keystroke's request (answered)."""
        client = self.server.client  # type: ignore[union-attr]
        pace = self.options.pace_ms / 1000.0
        previous: _Live | None = None
        ticker = self.options.progress and sys.stderr.isatty()
        for number, key in enumerate(keys):
            if previous is not None and not previous.taken:
                if previous.request.future.done():
                    self._take(previous)  # came in as this keystroke was due: still shown
                else:
                    client.cancel(previous.request)  # superseded by this keystroke
            client.notify(
                "textDocument/didChange", doc.edit(cursor - key.delete, cursor, key.insert)
            )
            cursor += len(key.insert) - key.delete
            remaining = truth[key.done :] if key.comparable else None
            current = self._ask(doc, cursor, key.kind, remaining=remaining, typed=key.insert)
            final = number == len(keys) - 1
            if final or self.options.await_answers:
                await self._wait(current, f"keystroke {number + 1}/{len(keys)}")
                if not final:
                    await asyncio.sleep(pace)
            else:
                deadline = current.request.sent + pace
                done, _ = await asyncio.wait(
                    {current.request.future}, timeout=max(0.0, deadline - time.perf_counter())
                )
                if done:
                    self._take(current)
                    await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            if ticker:
                print(f"\r    typed {number + 1}/{len(keys)} keystrokes", end="", file=sys.stderr)
            previous = current
        if ticker:
            print("\r", end="", file=sys.stderr)
        return cursor, previous

    async def _accept_and_ask(
        self,
        doc: EditorDocument,
        cursor: int,
        shown: _Live | None,
        kind: str,
        pause_ms: float,
        hole_record: dict[str, Any],
    ) -> int:
        """Tab on `shown`'s suggestion, wait `pause_ms`, ask; the cursor after. Without a
        suggestion to accept, nothing happens and the hole says so."""
        if shown is None or shown.item is None or not item_text(shown.item):
            hole_record.setdefault("accept_skipped", []).append(kind)
            return cursor
        cursor = self._accept(doc, shown)
        if pause_ms:
            await asyncio.sleep(pause_ms / 1000.0)
        await self._ask_and_wait(doc, cursor, kind)
        return cursor

    def _accept(self, doc: EditorDocument, live: _Live) -> int:
        """Tab: the suggestion's range replaced by its text; the cursor after it."""
        item = live.item or {}
        range_ = item.get("range")
        start = doc.offset(range_["start"]) if range_ else live.offset
        end = doc.offset(range_["end"]) if range_ else live.offset
        text = item_text(item)
        client = self.server.client  # type: ignore[union-attr]
        client.notify("textDocument/didChange", doc.edit(start, end, text))
        return start + len(text)

    # --- requests ---------------------------------------------------------------------------

    def _ask(
        self,
        doc: EditorDocument,
        offset: int,
        kind: str,
        *,
        remaining: str | None = None,
        typed: str | None = None,
    ) -> _Live:
        client = self.server.client  # type: ignore[union-attr]
        request = client.request("textDocument/inlineCompletion", inline_params(doc, offset))
        position = doc.position(offset)
        record: dict[str, Any] = {
            "hole": self._hole_index,
            "kind": kind,
            "id": request.id,
            "file_role": "other" if kind == "other-file" else "hole",
            "line": position["line"],
            "character": position["character"],
            "version": doc.document.version,
            "typed": typed,
            "sent_s": round(request.sent - self._clock, 4),
        }
        live = _Live(record, request, doc, offset, remaining)
        self._live.append(live)
        return live

    async def _wait(self, live: _Live, what: str) -> None:
        client = self.server.client  # type: ignore[union-attr]

        def heartbeat(waited: float) -> None:
            self.say(f"    waiting for the answer to the {what} request ({waited:.0f} s)…")

        await client.wait(
            live.request,
            self.options.request_timeout_s,
            what=f"the {what} request",
            heartbeat=heartbeat,
        )
        self._take(live)

    async def _ask_and_wait(
        self, doc: EditorDocument, offset: int, kind: str, *, remaining: str | None = None
    ) -> _Live:
        live = self._ask(doc, offset, kind, remaining=remaining)
        await self._wait(live, kind)
        return live

    def _take(self, live: _Live) -> None:
        """Read an answer that came while the document still was as the request saw it."""
        answer = live.request.future.result()  # raises when the server exited
        live.taken = True
        record = live.record
        record["latency_ms"] = round((answer.received - live.request.sent) * 1000, 3)
        if answer.error:
            record["outcome"] = "error"
            record["error"] = answer.error.get("message")
            return
        item = first_item(answer.result)
        live.item = item
        text = self._visible(live, item) if item else ""
        record["suggestion"] = text
        record["outcome"] = "shown" if text else "empty"
        record["matched"] = (
            suggestion_matches(text, live.remaining) if live.remaining is not None else None
        )

    @staticmethod
    def _visible(live: _Live, item: dict[str, Any]) -> str:
        """What the suggestion adds at the cursor (what it re-types around it taken off)."""
        text = item_text(item)
        range_ = item.get("range")
        if not range_:
            return text
        doc, cursor = live.doc, live.offset
        start, end = doc.offset(range_["start"]), doc.offset(range_["end"])
        before = doc.text[start:cursor] if start < cursor else ""
        if before and text.startswith(before):
            text = text[len(before) :]
        after = doc.text[cursor:end] if end > cursor else ""
        if after and text.endswith(after):
            text = text[: -len(after)]
        return text

    async def _settle(self) -> None:
        """Wait (a while) for the answers still owed: every request must be answered, the
        cancelled ones too."""
        owed = [live.request.future for live in self._live if not live.request.future.done()]
        if owed:
            await asyncio.wait(owed, timeout=SETTLE_S)

    def _finish_requests(self, record: dict[str, Any]) -> None:
        """Fill in the hole's request records (answer, stats) and move them to the variant."""
        server = self.server
        for live in self._live:
            rec, request = live.record, live.request
            rec["cancel_sent"] = request.cancel_sent is not None
            if request.cancel_sent is not None:
                rec["cancel_ms"] = round((request.cancel_sent - request.sent) * 1000, 3)
            future = request.future
            answer = request.answer
            if answer is None:
                rec["response"] = "exited" if future.done() else "none"
            else:
                rec["response"] = (
                    "cancelled" if answer.cancelled else "error" if answer.error else "result"
                )
                rec["answer_ms"] = round((answer.received - request.sent) * 1000, 3)
            if request.cancel_sent is not None and not live.taken:
                rec["outcome"] = "superseded"
                rec["latency_ms"] = rec["cancel_ms"]
            elif not live.taken:
                rec["outcome"] = "unanswered" if answer is None else rec.get("outcome", "late")
            stats = server.stats.get(request.id) if server is not None else None
            rec["stats"] = stats is not None
            if stats is not None:
                rec.update(
                    prefill_tokens=stats.get("prefillTokens"),
                    reused_tokens=stats.get("reusedTokens"),
                    prompt_tokens=stats.get("promptTokens"),
                    new_tokens=stats.get("tokens"),
                    cached=bool(stats.get("cached")),
                    source=stats.get("source")
                    or ("typed-ahead" if stats.get("cached") else "model"),
                    server_ms=stats.get("latencyMs"),
                )
            record["requests"].append(rec)
        self._live = []


# --- the command ----------------------------------------------------------------------------


def add_typing_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "typing",
        "with --typing: replay typing sessions through `quickdraft serve` over stdio LSP, as VS"
        " Code drives it (--strategies picks strategies; default ar,hybrid)",
    )
    group.add_argument(
        "--typing",
        action="store_true",
        help="the typing benchmark: a fresh server per variant, keystrokes over LSP",
    )
    group.add_argument(
        "--typing-layouts", metavar="L,L", help="context.layout values (default append,classic)"
    )
    group.add_argument(
        "--typing-work-ahead",
        metavar="on,off",
        help="cache.warmup and cache.prefetch on and/or off (default on,off)",
    )
    group.add_argument(
        "--typing-pace-ms",
        type=float,
        default=120.0,
        help="time between keystrokes (default 120)",
    )
    group.add_argument(
        "--typing-await",
        action="store_true",
        help="wait for each keystroke's answer before the next (then the pace)",
    )
    group.add_argument(
        "--typing-lines", type=int, default=3, help="hidden lines typed per hole (default 3)"
    )
    group.add_argument(
        "--typing-timeout-s",
        type=float,
        default=600.0,
        help="longest wait for one answer before the server counts as stuck (default 600)",
    )
    group.add_argument(
        "--typing-load-timeout-s",
        type=float,
        default=1800.0,
        help="longest wait for the server to load its models (default 1800)",
    )


def model_flags(args: argparse.Namespace) -> list[str]:
    """The model flags the bench got, to start `quickdraft serve` with (every flag that
    `add_model_arguments` defines, so new ones travel without changes here)."""
    from quickdraft.cli_args import add_model_arguments

    probe = argparse.ArgumentParser(add_help=False)
    add_model_arguments(probe)
    flags: list[str] = []
    for action in probe._actions:
        if not action.option_strings:
            continue
        value = getattr(args, action.dest, None)
        if value is None or value is False:
            continue
        flag = max(action.option_strings, key=len)
        flags += [flag] if action.nargs == 0 else [flag, str(value)]
    return flags


def base_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings tree from --config and --max-tokens (validated here, at the edge)."""
    from quickdraft.config import load_config

    settings: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        try:
            settings = json.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--config: cannot read {args.config}: {exc}") from None
        if not isinstance(settings, dict):
            raise ConfigError(f"--config: {args.config} must hold a JSON object")
    if getattr(args, "max_new_tokens", None):
        settings = merge_settings(settings, {"decoding": {"maxNewTokens": args.max_new_tokens}})
    load_config(settings)  # ConfigError names the key
    return settings


def run_typing(args: argparse.Namespace) -> int:
    """`quickdraft bench --typing ...`: returns the exit status."""
    from quickdraft.bench.holes import resolve_languages, sample_holes
    from quickdraft.config import load_config

    repo = Path(args.repo).expanduser()
    if not repo.is_dir():
        raise ConfigError(f"--repo: {repo} is not a directory")
    wanted = (
        args.holes if args.holes is not None else (QUICK_HOLES if args.quick else DEFAULT_HOLES)
    )
    if wanted < 1:
        raise ConfigError(f"--holes: must be at least 1, got {wanted}")
    if args.sweep_draft_length:
        raise ConfigError(
            "--sweep-draft-length: not with --typing (it times strategies in-process)"
        )
    if args.typing_pace_ms < 0:
        raise ConfigError(f"--typing-pace-ms: must not be negative, got {args.typing_pace_ms}")
    if args.typing_lines < 1:
        raise ConfigError(f"--typing-lines: must be at least 1, got {args.typing_lines}")
    variants = parse_variants(args.typing_layouts, args.strategies, args.typing_work_ahead)
    settings = base_settings(args)
    for variant in variants:
        load_config(merge_settings(settings, variant.settings()))
    languages = resolve_languages(args.languages) if args.languages else None
    holes = [
        hole
        for hole in sample_holes(
            repo,
            wanted * 2,
            languages=languages,
            seed=args.seed,
            kinds=HOLE_KINDS,
            open_files=args.open_files,
        )
        if "\r" not in hole.text and typing_truth(hole.truth, args.typing_lines).strip()
    ][:wanted]
    if not holes:
        raise ConfigError(f"--repo: found no completion points in {repo}")
    flags = model_flags(args)
    if args.quick and "--no-calibrate" not in flags:
        flags.append("--no-calibrate")
    out = args.out or Path("bench-out") / datetime.now().strftime("typing-%Y%m%d-%H%M%S")
    options = TypingOptions(
        repo=repo.resolve(),
        out=Path(out),
        variants=variants,
        server_command=[sys.executable, "-m", "quickdraft.cli", "serve", *flags],
        settings=settings,
        pace_ms=args.typing_pace_ms,
        await_answers=args.typing_await,
        max_lines=args.typing_lines,
        request_timeout_s=args.typing_timeout_s,
        load_timeout_s=args.typing_load_timeout_s,
        progress=not args.no_progress,
    )
    bench = TypingBench(holes, options)
    bench.say(
        f"{len(holes)} holes from {repo}, {len(variants)} variants "
        f"({', '.join(v.name for v in variants)}), "
        + (
            "each keystroke awaited"
            if args.typing_await
            else f"a keystroke every {args.typing_pace_ms:.0f} ms"
        )
    )
    try:
        results = bench.run()
    except KeyboardInterrupt:
        bench.say(f"interrupted; what was measured is in {options.out}")
        raise
    print(typing_report.summary_table(results))
    print(f"\nresults: {options.out / 'results.json'}  report: {options.out / 'report.md'}")
    failed = typing_report.failures(results)
    for line in failed:
        print(f"{PREFIX}: {line}", file=sys.stderr)
    return 1 if failed else 0
