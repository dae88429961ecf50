"""`quickdraft bench --typing`: typing sessions replayed through the real language server.

For every variant (prompt layout x strategy x work ahead on/off) a fresh `quickdraft serve` runs
as a subprocess with the bench's model flags (typing_server.py), and this module talks to it over
stdio exactly as VS Code does (lsp_client.py, editor.py): `initialize` with the settings tree as
`initializationOptions`, `didOpen`, incremental `didChange` with UTF-16 ranges and versions, an
automatic `textDocument/inlineCompletion` after every edit, and `$/cancelRequest` for a request
still open when the next keystroke comes.

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
was measured; report.md and the plot come from typing_report.py. The keystrokes are planned in
typing_plan.py; the command line is typing_cli.py.

Another `Scenario` can run on the same servers instead of the holes, with its own report:
`--typing-scenario workspace` (workspace_replay.py) opens files together and visits them.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from quickdraft.bench import typing_report
from quickdraft.bench.editor import EditorDocument, first_item, inline_params, item_text
from quickdraft.bench.holes import Hole
from quickdraft.bench.lsp_client import Request, StdioLspClient
from quickdraft.bench.provenance import provenance
from quickdraft.bench.typing_plan import (
    Keystroke,
    auto_indent,
    guess_indent_unit,
    other_file_spot,
    plan_keystrokes,
    suggestion_matches,
    typing_truth,
)
from quickdraft.bench.typing_server import TypingServer, run_and_write_results
from quickdraft.errors import LanguageServerError
from quickdraft.models.store import write_json_atomic

PREFIX = "quickdraft bench --typing"
SETTLE_S = 30.0
"""How long the answers still owed at the end of a hole are waited for before they count as
unanswered."""
REUSE_SPLIT = ("reused_shared_tokens", "reused_warm_tokens", "reused_own_tokens")
"""Where the reused prompt tokens came from, when the server's stats say (snake_case, or
camelCase, at the top or under `engine`)."""


class TypingReport(Protocol):
    """What turns the recorded requests into numbers: typing_report.py, workspace_report.py."""

    def summarize_variant(self, variant: dict[str, Any]) -> dict[str, Any]: ...

    def render_markdown(self, results: dict[str, Any], plots: list[str] | None = None) -> str: ...

    def write_plot(self, directory: Path, results: dict[str, Any]) -> list[str]: ...


class Scenario(Protocol):
    """Another conversation than the hole replay, run once per variant on its server."""

    name: str
    report: TypingReport

    def environment(self) -> dict[str, Any]: ...

    async def run(self, bench: TypingBench, record: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Variant:
    layout: str
    strategy: str
    work_ahead: bool
    candidates: int | None = None
    """`decoding.candidates`; None: the setting as it is (the default's, or --config's)."""

    @property
    def name(self) -> str:
        name = f"{self.layout}/{self.strategy}/ahead-{'on' if self.work_ahead else 'off'}"
        return name if self.candidates is None else f"{name}/candidates-{self.candidates}"

    def settings(self) -> dict[str, Any]:
        """The part of the settings tree this variant sets."""
        decoding: dict[str, Any] = {"strategy": self.strategy}
        if self.candidates is not None:
            decoding["candidates"] = self.candidates
        return {
            "context": {"layout": self.layout},
            "cache": {"warmup": self.work_ahead, "prefetch": self.work_ahead},
            "decoding": decoding,
        }


def merge_settings(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` laid over `base`, section by section (neither is modified)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_settings(merged[key], value)
        else:
            merged[key] = value
    return merged


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
    """The typing bench: every variant's server, and on it the hole replay or `scenario`."""

    def __init__(
        self, holes: list[Hole], options: TypingOptions, scenario: Scenario | None = None
    ) -> None:
        self.holes = holes
        self.options = options
        self.scenario = scenario
        self.report: TypingReport = scenario.report if scenario else typing_report
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
        scenario = self.scenario
        return {
            **provenance(),
            "scenario": scenario.name if scenario else "holes",
            **({"workspace": scenario.environment()} if scenario else {}),
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
                name: self.report.summarize_variant(variant)
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
            plots = self.report.write_plot(self.out, results)
            (self.out / "report.md").write_text(
                self.report.render_markdown(results, plots), encoding="utf-8"
            )
        return results

    # --- running --------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Every variant in turn; results written as they come, and at the end in any case."""
        return run_and_write_results(self, self._run_all())

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
            record["server"]["warmup_s"] = await server.start_and_warm_up(options.load_timeout_s)
            record["server"].update(self._server_facts(server))
            self.say(
                f"  ready after {time.perf_counter() - started:.1f} s: runtime "
                f"{record['server']['runtime']}, dtype {record['server']['dtype']}, "
                f"device {record['server']['device']}"
            )
            if self.scenario is not None:
                await self.scenario.run(self, record)
            else:
                for index, hole in enumerate(self.holes):
                    await self._run_hole(record, index, hole)
                    self.write(final=False)
        except LanguageServerError as exc:
            record["error"] = str(exc)
            self.say(f"  variant {variant.name} stopped: {exc}")
            self.finish_requests(record)
        finally:
            await server.close_and_note(record["server"])
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
        await self.settle()
        self.finish_requests(record)
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
        fields: dict[str, Any] | None = None,
    ) -> _Live:
        """Send the request; `fields` go into its record (over the hole's)."""
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
            **(fields or {}),
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
        self,
        doc: EditorDocument,
        offset: int,
        kind: str,
        *,
        remaining: str | None = None,
        fields: dict[str, Any] | None = None,
    ) -> _Live:
        live = self._ask(doc, offset, kind, remaining=remaining, fields=fields)
        await self._wait(live, kind)
        return live

    async def ask_and_wait(
        self,
        doc: EditorDocument,
        offset: int,
        kind: str,
        *,
        remaining: str | None = None,
        fields: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One request at `offset`, awaited; its record (stats come in finish_requests)."""
        live = await self._ask_and_wait(doc, offset, kind, remaining=remaining, fields=fields)
        return live.record

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

    @property
    def client(self) -> StdioLspClient:
        """The current variant's server connection."""
        return self.server.client  # type: ignore[union-attr]

    async def settle(self) -> None:
        """Wait (a while) for the answers still owed: every request must be answered, the
        cancelled ones too."""
        owed = [live.request.future for live in self._live if not live.request.future.done()]
        if owed:
            await asyncio.wait(owed, timeout=SETTLE_S)

    def finish_requests(self, record: dict[str, Any]) -> None:
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
                    stages_ms=stats.get("stagesMs") or {},
                    # How the answer was decoded: a slow decode is told apart from a slow
                    # forward by these.
                    target_forwards=stats.get("targetForwards"),
                    drafted_by_source=stats.get("draftedBySource") or {},
                    accepted_by_source=stats.get("acceptedBySource") or {},
                )
                rec.update(reuse_split(stats))
            record["requests"].append(rec)
        self._live = []


def reuse_split(stats: dict[str, Any]) -> dict[str, int]:
    """The reused-token split the server's stats carry (`reused_shared_tokens`, ...), as far as
    they carry it: a field it does not send is left out."""
    engine = stats.get("engine") if isinstance(stats.get("engine"), dict) else {}
    split: dict[str, int] = {}
    for key in REUSE_SPLIT:
        head, *rest = key.split("_")
        camel = head + "".join(part.title() for part in rest)
        for value in (stats.get(camel), stats.get(key), engine.get(key)):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                split[key] = int(value)
                break
    return split
