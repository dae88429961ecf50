"""Completion requests, whatever LSP feature asked: checks, typed-ahead, the worker, stats.

`inlineCompletion` and the `completion` fallback differ only in how they dress the answer; the
work is here. Everything runs on the event loop except `ModelHost.complete`, which runs on the
model worker thread. Next edits (`textDocument/copilotInlineEdit`) have their own service
below (`NextEditService`), on the same worker: one model, one queue.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.protocol.json_rpc import MsgId

from quickdraft.admission import refusal
from quickdraft.errors import PositionError, QuickdraftError
from quickdraft.generation import ModelAnswer
from quickdraft.lsp.documents import Document, completion_request, next_edit_request
from quickdraft.lsp.server_api import ServerApi
from quickdraft.lsp.status import WaitProgress
from quickdraft.lsp.typed_ahead import TypedAheadCache
from quickdraft.lsp.work_ahead import WorkAhead
from quickdraft.text import position_after

if TYPE_CHECKING:
    from quickdraft.completer import Completion
    from quickdraft.context.edit_prompt import EditableRegion
    from quickdraft.next_edit import DecidedEdit, Edit, NextEdit

logger = logging.getLogger(__name__)

STATS_NOTIFICATION = "$/quickdraft/stats"


@dataclass(frozen=True)
class Suggestion:
    """One item of an answer: the text, and the model's probability of it (None: not known)."""

    text: str
    confidence: float | None = None


@dataclass
class Answer:
    """Suggestions placed in a document: each text replaces `start`..`end` (LSP positions).

    Completer text is inserted at the cursor: it never repeats what is typed (a typed-ahead
    answer is the rest of the suggestion) and never overlaps the text after the cursor
    (postprocess.finalize), so the range is empty. Clients expect a range all the same.
    The greedy suggestion is `text`; `others` are the alternatives, most likely first.
    """

    text: str
    start: types.Position
    end: types.Position
    cursor: types.Position
    confidence: float | None = None
    others: list[Suggestion] = field(default_factory=list)

    @property
    def items(self) -> list[Suggestion]:
        return [Suggestion(self.text, self.confidence), *self.others]


@dataclass
class _Alternatives:
    """The alternatives computed (or being computed) for one place in a document."""

    prefix: str
    suffix: str
    future: asyncio.Future
    """Resolves to the alternatives (`Completer.alternatives`' list, maybe empty)."""
    cancel: threading.Event | None = None
    """Stops the job when it runs as a request (`now`); a background job's is the worker's."""

    def serves(self, prefix: str, suffix: str) -> bool:
        return prefix == self.prefix and suffix == self.suffix and not self.future.cancelled()


@dataclass
class _Job:
    """A completion running (or queued) on the worker, and the requests waiting for it."""

    text: str
    offset: int
    future: asyncio.Future
    cancel: threading.Event
    wait: WaitProgress
    """What the client is told while it waits (after a second), until the job ends."""
    waiters: int = 1
    prefetched: bool = False
    """Its answer is a prefetch's, computed in the background before the request came."""
    floor: float = 0.0
    """The confidence under which it stops writing (`CompletionRequest.min_confidence`)."""

    def serves(self, text: str, offset: int, floor: float) -> bool:
        """Whether a request at `offset` in `text` that shows what reaches `floor` can take
        this job's answer (not one that stops sooner than that request would)."""
        return (
            not self.cancel.is_set()
            and offset == self.offset
            and (text is self.text or text == self.text)
            and self.floor <= floor
        )


class CompletionService:
    def __init__(self, server: ServerApi, typed_ahead: TypedAheadCache, work_ahead: WorkAhead):
        self.server = server
        self.typed_ahead = typed_ahead
        """Answers on the event loop, so a typed-ahead hit never waits for the worker."""
        self.work_ahead = work_ahead
        """Prefetches the completion that follows accepting an answer."""
        self._inflight: dict[str, _Job] = {}
        self._alternatives: dict[str, _Alternatives] = {}
        """Per document, the alternatives for the place of its last answer."""
        self.accepted_by_index: dict[int, int] = {}
        """How often each item's index was accepted (0: the first suggestion)."""

    # --- the request ------------------------------------------------------------------

    async def complete(
        self,
        uri: str,
        position: types.Position,
        *,
        feature: str,
        request_id: MsgId,
        invoked: bool = False,
    ) -> Answer | None:
        """The suggestions at `position` in `uri`, or None when there is none to give.
        `invoked`: the person asked (triggerKind Invoked): no confidence floor, and the
        alternatives are waited for (computed now if they are not yet); otherwise the first
        suggestion is answered as soon as it is known and the alternatives come in the
        background, for the next request at the same place."""
        server = self.server
        document = server.documents.get(uri)
        if document is None:
            server.log(f"[{request_id}] {feature}: {uri} is not open; no completion", "warning")
            return None
        config = server.config.current
        refused = refusal(config, "completion", document.language_id, document.text)
        if refused is not None:
            server.log(f"[{request_id}] {feature}: {uri}: {refused}; no completion", refused.level)
            return None
        try:
            column = document.to_codepoint(position.line, position.character, strict=True)
        except PositionError as exc:
            server.log(f"[{request_id}] {feature}: {uri}: {exc}; no completion", "warning")
            return None

        text = document.text
        offset = document.line_starts[position.line] + column
        document.cursor_at = offset
        # The answer belongs to this version of the document, whatever edits arrive meanwhile.
        cursor = types.Position(
            line=position.line, character=document.from_codepoint(position.line, column)
        )
        started = time.monotonic()

        # Typed ahead: the user typed the start of the current suggestion, or accepted one
        # whose continuation was computed ahead (prefetch).
        prefix, suffix = text[:offset], text[offset:]
        alternatives = self._alternatives.get(uri)
        if alternatives is not None and not alternatives.serves(prefix, suffix):
            self._cancel_alternatives(uri)  # the person moved on: not worth computing

        # Unasked, a suggestion less likely than the floor is held back, so the engine may
        # stop writing it as soon as it is (`CompletionRequest.min_confidence`).
        floor = self._floor(invoked)

        def place():
            """The Completer's request for this place (built when some work needs one)."""
            return completion_request(
                uri, document.language_id, text, offset, position.line, column, floor=floor
            )

        hit = self.typed_ahead.lookup(uri, prefix, suffix)
        if hit is not None and hit.source == "unsure" and (hit.confidence or 0.0) >= floor:
            hit = None  # stopped unsure under a higher floor: asked for, it is written whole
        if hit is not None:
            self._cancel_inflight(uri)
            hidden = self._below_floor(hit.confidence, invoked, request_id, feature)
            self._report(
                request_id,
                uri,
                feature,
                started,
                None,
                source=hit.source,
                text="" if hidden else hit.text,
                confidence=hit.confidence,
                below_floor=hidden,
            )
            if not hit.text or hidden:
                return None  # computed ahead: the model has nothing to add here
            others = await self._others(place(), hit.text, invoked)
            return Answer(hit.text, cursor, cursor, cursor, hit.confidence, others)

        # The same request already running (editors ask for inline completion and the completion
        # menu at once) is shared; any other running request for the document is superseded.
        current = self._inflight.get(uri)
        if current is not None and current.serves(text, offset, floor):
            job, joined = current, True
            job.waiters += 1
        else:
            self._cancel_inflight(uri)
            request, name = place(), f"[{request_id}] {feature}"
            wait = WaitProgress(server, asyncio.get_running_loop(), str(request_id), uri)
            job = self._await_prefetch(request, name, wait) or self._submit(request, name, wait)
            joined = False
        try:
            completion = await asyncio.shield(job.future)
        except asyncio.CancelledError:
            job.waiters -= 1
            if job.waiters == 0:
                job.cancel.set()  # $/cancelRequest: the engine stops at its next step
            server.log(f"[{request_id}] {feature}: cancelled")
            raise
        except QuickdraftError as exc:
            server.log(f"[{request_id}] {feature}: {exc}", "warning")
            return None

        if job.cancel.is_set():
            server.log(f"[{request_id}] {feature}: superseded by a newer request")
            return None
        if completion.skipped:
            server.log(f"[{request_id}] {feature}: {completion.skipped}; no completion")
            return None
        unsure = completion.stop_reason == "unsure"  # held back before it was done
        if unsure:
            server.log(
                f"[{request_id}] {feature}: confidence fell to {completion.confidence or 0.0:.3f}"
                f" after {len(completion.tokens)} tokens, below the floor {floor:.3f}"
                " (decoding.min_confidence); stopped, no completion"
            )
            # Back here unasked, or typing what it had written, the answer is known to be
            # held back: no model time for it (asked for, it is written whole).
            self.typed_ahead.remember(
                uri,
                prefix,
                completion.raw_text,
                suffix,
                source="unsure",
                confidence=completion.confidence,
            )
        suggestion = completion.text or ""
        confidence = completion.confidence
        # A request that joined another did no model work of its own: reported as cached.
        # Waiting for the models to load is not part of a completion's latency.
        serving = server.serving
        hidden = bool(suggestion) and self._below_floor(confidence, invoked, request_id, feature)
        self._report(
            request_id,
            uri,
            feature,
            max(started, serving.loaded_at) if serving is not None else started,
            None if joined or job.prefetched else completion,
            source="shared" if joined else "prefetch" if job.prefetched else "model",
            text="" if hidden else suggestion,
            confidence=confidence,
            below_floor=hidden or unsure,
        )
        if not suggestion:
            return None
        self.typed_ahead.remember(uri, prefix, suggestion, suffix, confidence=confidence)
        config = server.config.current
        # Work ahead (alternatives, prefetch) where the backend pays for it: a local engine. A
        # serving engine's capacity is for the requests of everyone who shares it, and its
        # failures must not show twice.
        local = server.works_ahead
        # Prefetch first: accepting a suggestion is likelier than cycling through others, and
        # a request right after Tab should find its answer ready. (The prefetch runs in a slot
        # of its own, so the alternatives still find this answer's cache.) Not for a
        # suggestion held back: it cannot be accepted (shown when asked for, its acceptance
        # prefetches).
        if not joined and config.cache.prefetch and local and not hidden:
            self.work_ahead.prefetch(
                uri, document.language_id, text, offset, position.line, column, suggestion
            )
        if not joined and local and config.decoding.candidates > 1 and not invoked:
            # After the answer (it is sent first): its forks, for the next request here.
            self._start_alternatives(place())
        if hidden:
            return None
        others = await self._others(place(), suggestion, invoked)
        return Answer(suggestion, cursor, cursor, cursor, confidence, others)

    # --- several suggestions, and silence when unsure -------------------------------------

    def _floor(self, invoked: bool) -> float:
        """The confidence under which a suggestion is held back: decoding.min_confidence when
        the editor asked by itself, 0 when the person asked (`invoked`)."""
        return 0.0 if invoked else self.server.config.current.decoding.min_confidence

    def _below_floor(
        self, confidence: float | None, invoked: bool, request_id: MsgId, feature: str
    ) -> bool:
        """Whether a suggestion the editor asked for by itself is too unsure to show."""
        floor = self._floor(invoked)
        if invoked or confidence is None or confidence >= floor:
            return False
        self.server.log(
            f"[{request_id}] {feature}: confidence {confidence:.3f} is below the floor"
            f" {floor:.3f} (decoding.min_confidence); no completion"
        )
        return True

    async def _others(self, place, first: str, invoked: bool) -> list[Suggestion]:
        """The alternatives to `first` at `place` (a CompletionRequest): those computed already (or, when the
        person asked, computed now), less any that read like `first`, and (not asked) any
        below the confidence floor."""
        config = self.server.config.current
        if config.decoding.candidates < 2 or not self.server.works_ahead:
            return []
        entry = self._alternatives.get(place.uri)
        if entry is None or not entry.serves(
            place.text[: place.offset], place.text[place.offset :]
        ):
            if not invoked:
                return []
            entry = self._start_alternatives(place, now=True)
        if not entry.future.done():
            if not invoked:
                return []
            try:
                await asyncio.shield(entry.future)
            except asyncio.CancelledError:
                if not entry.future.cancelled():
                    raise  # this request was cancelled ($/cancelRequest)
                return []  # the job was: a newer request for the document stopped it
            except Exception as exc:  # noqa: BLE001 - the first suggestion still stands
                self.server.log(f"alternatives: {exc}", "warning")
                return []
        if entry.future.cancelled() or entry.future.exception() is not None:
            return []
        floor = self._floor(invoked)
        others = [
            Suggestion(item.text, item.confidence)
            for item in entry.future.result()
            if item.text != first and (item.confidence is None or item.confidence >= floor)
        ]
        return others[: config.decoding.candidates - 1]

    def _start_alternatives(self, request, *, now: bool = False) -> _Alternatives:
        """Compute the alternatives at `request`'s place on the worker: in the background (a
        keystroke's request stops it), or `now`, as a request of its own."""
        uri, text, offset = request.uri, request.text, request.offset
        self._cancel_alternatives(uri)
        server = self.server
        count = server.config.current.decoding.candidates - 1
        cancel = None
        if now:
            cancel = threading.Event()
            future = server.worker.submit(
                server.host.alternatives, request, count, cancel=cancel, preempt=True
            )
        else:
            future = server.worker.submit_background(server.host.alternatives, request, count)
        waiting = asyncio.wrap_future(future)
        entry = _Alternatives(text[:offset], text[offset:], waiting, cancel)
        self._alternatives[uri] = entry

        def finished(done: asyncio.Future) -> None:
            if done.cancelled():
                return
            if done.exception() is not None:
                server.log(f"alternatives for {uri}: {done.exception()}", "warning")
                return
            items = done.result()
            server.log(f"alternatives: {len(items)} ready for {uri}", "log")

        waiting.add_done_callback(finished)
        return entry

    def _cancel_alternatives(self, uri: str) -> None:
        entry = self._alternatives.pop(uri, None)
        if entry is not None and not entry.future.done():
            entry.future.cancel()  # a queued job is skipped
            if entry.cancel is not None:
                entry.cancel.set()  # a running one stops at its next step

    def _submit(self, request, name: str, wait: WaitProgress) -> _Job:
        """Queue the generation of `request` (a CompletionRequest) on the worker."""
        cancel = threading.Event()
        future = self._generate(request, name, cancel, wait)
        job = _Job(
            request.text,
            request.offset,
            future,
            cancel,
            wait.start(),
            floor=request.min_confidence,
        )
        return self._track(job, request.uri)

    def _await_prefetch(self, request, name: str, wait: WaitProgress) -> _Job | None:
        """A job for `request` that waits for the prefetch already computing it (Tab, then the
        request at the end of the accepted text, before the prefetch is done), or None when
        none is. Stopping the prefetch would throw its work away and compute it again. Should
        the prefetch end stopped after all (a job that had to run preempted it), the request
        is generated as any other."""
        prefetch = self.work_ahead.prefetch_of(request.uri, request.offset, request.text)
        if prefetch is None:
            return None
        cancel = threading.Event()
        self.server.log(f"{name}: waiting for the prefetch computing it", "log")

        async def answer():  # runs once the event loop is back, when `job` is set
            completion = None
            try:
                completion = await asyncio.wrap_future(prefetch)
            except asyncio.CancelledError:
                if not prefetch.cancelled():
                    raise  # this task, not the prefetch (the server shuts down)
            except Exception:  # noqa: BLE001 - generated again below, which reports it
                pass
            if completion is not None and completion.stop_reason != "cancelled":
                return completion
            job.prefetched = False
            if cancel.is_set():
                return None  # superseded meanwhile: nobody reads it
            return await self._generate(request, name, cancel, wait)

        future = asyncio.ensure_future(answer())
        wait.start(running=True)  # the prefetch is computing it
        job = _Job(request.text, request.offset, future, cancel, wait, prefetched=True)
        return self._track(job, request.uri)

    def _track(self, job: _Job, uri: str) -> _Job:
        """`job` is the document's request in flight until it ends."""
        self._inflight[uri] = job

        def finished(done: asyncio.Future) -> None:
            if self._inflight.get(uri) is job:
                del self._inflight[uri]
            job.wait.finish()
            if not done.cancelled():
                done.exception()  # retrieved: every waiter may have gone

        job.future.add_done_callback(finished)
        return job

    def _generate(
        self, request, name: str, cancel: threading.Event, wait: WaitProgress
    ) -> asyncio.Future:
        """Queue the generation of `request` on the worker, stopping any background job. When
        the worker starts it, `name` ("[id] feature") is logged at log level with the time it
        waited in the queue: a client (or a test) knows the generation is running, not only
        asked for. `wait` hears that it runs and how far its prefills got."""
        server, loop, queued = self.server, asyncio.get_running_loop(), time.monotonic()

        def generate(request, cancel):  # worker thread
            if not cancel.is_set():
                waited_ms = (time.monotonic() - queued) * 1000
                message = f"{name}: generating ({waited_ms:.0f} ms queued)"
                loop.call_soon_threadsafe(server.log, message, "log")
            return wait.run(server.host.complete, request, cancel)

        return asyncio.wrap_future(server.worker.submit(generate, request, cancel, preempt=True))

    def accepted(self, uri: str, line: int, character: int, text: str, *, index: int = 0) -> str:
        """A suggestion was accepted (its item's command, run by the editor after inserting
        it): `text` at (line, character), LSP units of the document before it went in, the
        `index`th item of its answer (counted in `accepted_by_index`). Makes
        sure the completion that follows it is computed ahead: "ready" when the typed-ahead
        cache has it, "running" when its prefetch runs, "started" when this starts it; else
        why not ("prefetch off", "not open", "not there": the document does not hold `text`
        at that place)."""
        self.accepted_by_index[index] = self.accepted_by_index.get(index, 0) + 1
        server = self.server
        config = server.config.current
        if not (config.cache.prefetch and server.works_ahead):
            return "prefetch off"
        document = server.documents.get(uri)
        if document is None:
            return "not open"
        try:
            column = document.to_codepoint(line, character, strict=True)
        except PositionError:
            return "not there"
        start = document.line_starts[line] + column
        end = start + len(text)
        current = document.text
        if not text or current[start:end] != text:
            return "not there"
        if self.work_ahead.is_prefetching(uri, end, current):
            return "running"
        if self.typed_ahead.lookup(uri, current[:end], current[end:]) is not None:
            return "ready"
        end_line, end_column = position_after(line, column, text)
        self.work_ahead.prefetch_at(uri, document.language_id, current, end, end_line, end_column)
        return "started"

    def _cancel_inflight(self, uri: str) -> None:
        previous = self._inflight.pop(uri, None)
        if previous is not None:
            previous.cancel.set()

    def forget(self, uri: str) -> None:
        self._cancel_inflight(uri)
        self._cancel_alternatives(uri)
        self.work_ahead.cancel_prefetches(uri)
        self.typed_ahead.invalidate(uri)

    # --- answers ----------------------------------------------------------------------

    def _report(
        self,
        request_id: MsgId,
        uri: str,
        feature: str,
        started: float,
        completion: Completion | None,
        *,
        source: str,
        text: str,
        confidence: float | None = None,
        below_floor: bool = False,
    ) -> None:
        latency_ms = (time.monotonic() - started) * 1000.0
        payload = stats_payload(completion, latency_ms=latency_ms, source=source)
        payload.update(
            repeated=completion is not None and completion.repeated,
            repeatTrimmed=completion is not None and completion.repeat_trimmed,
            uri=uri,
            requestId=request_id,
            feature=feature,
            chars=len(text),
            confidence=None if confidence is None else round(confidence, 6),
            belowFloor=below_floor,  # not shown: the model was unsure (decoding.min_confidence)
            # Accepted items so far by their place in the answer: [first, second, ...].
            acceptedByIndex=[
                self.accepted_by_index.get(i, 0)
                for i in range(max(self.accepted_by_index, default=-1) + 1)
            ],
        )
        if self.server.serving is not None:
            payload["compute"] = self.server.serving.compute
        self.server.protocol.notify(STATS_NOTIFICATION, payload)
        cached = payload["cached"]
        what = source if cached else f"{payload['tokens']} tokens"
        self.server.log(
            f"[{request_id}] {feature}: {len(text)} chars, {what}, {latency_ms:.0f} ms"
            + (f", {payload['tokensPerForward']:.2f} tokens/forward" if not cached else "")
        )


# --- next edits ------------------------------------------------------------------------------


def edit_item(snapshot: Document, edit: Edit, version: int) -> dict[str, Any]:
    """One edit of a `copilotInlineEdit` answer: its text, its range in LSP units of the
    document as it was asked about (`snapshot`), and that document's version."""
    start_line, start_character = snapshot.position_at(edit.start)
    end_line, end_character = snapshot.position_at(edit.end)
    return {
        "text": edit.text,
        "range": {
            "start": {"line": start_line, "character": start_character},
            "end": {"line": end_line, "character": end_character},
        },
        "textDocument": {"uri": snapshot.uri, "version": version},
    }


class NextEditService:
    """`textDocument/copilotInlineEdit`: checks on the event loop, the rewrite on the model
    worker, the answer in the version of the document asked about. A newer request for a
    document supersedes the one running for it (its generation stops at its next step). The
    rules' decision made ahead for that version (work_ahead.py) is taken when it is done, or
    waited for when it is running; one still queued is dropped and the request decides."""

    def __init__(self, server: ServerApi, work_ahead: WorkAhead):
        self.server = server
        self.work_ahead = work_ahead
        self._inflight: dict[str, threading.Event] = {}

    async def suggest(
        self,
        uri: str,
        version: int,
        position: tuple[int, int],
        *,
        request_id: MsgId,
        feature: str = "inlineEdit",
    ) -> list[dict[str, Any]]:
        """The edits to show for `uri` at `version`, cursor at `position` (LSP units); empty
        when there are none or the request cannot be answered (logged)."""
        server = self.server
        document = server.documents.get(uri)
        if document is None:
            server.log(f"[{request_id}] {feature}: {uri} is not open; no edit", "warning")
            return []
        if version != document.version:
            server.log(
                f"[{request_id}] {feature}: {uri} is at version {document.version}, not "
                f"{version}; no edit"
            )
            return []
        config = server.config.current
        refused = refusal(config, "edit", document.language_id, document.text)
        if refused is not None:
            server.log(f"[{request_id}] {feature}: {uri}: {refused}; no edit", refused.level)
            return []
        line, character = position
        try:
            column = document.to_codepoint(line, character, strict=True)
        except PositionError as exc:
            server.log(f"[{request_id}] {feature}: {uri}: {exc}; no edit", "warning")
            return []
        offset = document.line_starts[line] + column
        document.cursor_at = offset
        self.work_ahead.asks_edits = True
        request = next_edit_request(server.documents, document, offset, config.edits.history_files)
        # The answer's ranges are in this text, whatever edits arrive meanwhile.
        snapshot = Document(uri, request.text, document.language_id, version, document.encoding)
        self.cancel(uri)
        cancel = threading.Event()
        self._inflight[uri] = cancel
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        ahead = self.work_ahead.edit_decided(uri, version)
        wait = WaitProgress(
            server, loop, str(request_id), uri, doing="preparing a next edit"
        ).start(running=ahead is not None and ahead.running())
        try:
            decided = await self._decided_ahead(uri, ahead)
            future = server.worker.submit(
                wait.run, server.host.suggest_edit, request, cancel, decided, preempt=True
            )
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            cancel.set()  # $/cancelRequest: the engine stops at its next step
            server.log(f"[{request_id}] {feature}: cancelled")
            raise
        except QuickdraftError as exc:
            server.log(f"[{request_id}] {feature}: {exc}", "warning")
            return []
        finally:
            wait.finish()
            if self._inflight.get(uri) is cancel:
                del self._inflight[uri]
        if cancel.is_set() or result is None:
            server.log(f"[{request_id}] {feature}: superseded by a newer request")
            return []
        if result.skipped:
            server.log(f"[{request_id}] {feature}: {result.skipped}; no edit")
            return []
        items = [edit_item(snapshot, edit, version) for edit in result.edits]
        current = server.documents.get(uri)
        if current is None or current.version != version:
            server.log(f"[{request_id}] {feature}: {uri} changed meanwhile; no edit")
            items = []
        serving = server.serving
        self._report(
            request_id,
            uri,
            feature,
            max(started, serving.loaded_at) if serving is not None else started,
            result,
            items,
        )
        return items

    async def _decided_ahead(self, uri: str, ahead: Future | None) -> DecidedEdit | None:
        """The rules' decision made ahead for `uri` at the version asked (`ahead`, the job
        `WorkAhead.edit_decided` gave): taken when done, waited for when running; None when
        there is none, it is still queued (dropped: the request decides, now) or it was
        stopped."""
        if ahead is None:
            return None
        if not ahead.done() and not ahead.running():
            self.work_ahead.drop_edit(uri)
            return None
        try:
            decided = await asyncio.wrap_future(ahead)
        except asyncio.CancelledError:
            if ahead.cancelled():  # dropped meanwhile (the document closed): decide now
                return None
            raise
        except Exception:  # noqa: BLE001 - the request decides for itself (and reports a failure)
            decided = None
        if decided is None:
            self.work_ahead.drop_edit(uri)
        return decided

    def cancel(self, uri: str) -> None:
        """Stop the request running for `uri` (a newer one came, or the document closed)."""
        previous = self._inflight.pop(uri, None)
        if previous is not None:
            previous.set()

    def _report(
        self,
        request_id: MsgId,
        uri: str,
        feature: str,
        started: float,
        result: NextEdit,
        items: list[dict[str, Any]],
    ) -> None:
        latency_ms = (time.monotonic() - started) * 1000.0
        payload = stats_payload(result, latency_ms=latency_ms, source="model")
        region: EditableRegion | None = result.region
        payload.update(
            uri=uri,
            requestId=request_id,
            feature=feature,
            chars=sum(len(item["text"]) for item in items),
            editCount=len(items),
            copiedTokens=result.copied_tokens,
            format=result.format,
            rejected=result.rejected,
            regionLines=[region.start_line, region.end_line] if region is not None else None,
            rule=result.rule,
            confidence=result.confidence,
            candidates=result.candidates,
            vetoed=dict(result.vetoed),
            judged=result.judged,
            filled=result.filled,
            abstained=result.abstained,
            decidedAhead=result.ahead,
            headTokens=result.head_tokens,
        )
        if self.server.serving is not None:
            payload["compute"] = self.server.serving.compute
        self.server.protocol.notify(STATS_NOTIFICATION, payload)
        why = f" ({result.rejected})" if result.rejected else ""
        if payload["rule"] or payload["candidates"]:
            vetoes = ", ".join(f"{k} {v}" for k, v in payload["vetoed"].items()) or "none"
            shown = (
                f"rule {payload['rule']} ({payload['confidence']})"
                if payload["rule"]
                else "no rule"
            )
            judged = f", {payload['judged']} scored by the model" if payload["judged"] else ""
            judged += f", {payload['filled']} argument asked of it" if payload["filled"] else ""
            judged += ", decided ahead" if result.ahead else ""
            why += f" [{shown}; {payload['candidates']} candidates{judged}, vetoed: {vetoes}]"
        self.server.log(
            f"[{request_id}] {feature}: {len(items)} edits{why}, {payload['tokens']} tokens "
            f"({result.copied_tokens} copied), {latency_ms:.0f} ms, "
            f"{payload['tokensPerForward']:.2f} tokens/forward"
        )


def stats_payload(answer: ModelAnswer | None, *, latency_ms: float, source: str) -> dict[str, Any]:
    """The `$/quickdraft/stats` notification for one answered request (a completion's or a next
    edit's: the `ModelAnswer` both are; None: answered without the model). `source`: "model"
    (this request's own generation), "typed-ahead" or "prefetch" (answered from work done
    before), "shared" (joined another request's generation)."""
    cached = source != "model"
    stats: dict[str, Any] = dict(answer.stats.to_dict()) if answer is not None else {}
    new_tokens = len(answer.tokens) if answer is not None else 0
    drafted = stats.get("drafted_by_source") or {}
    accepted = stats.get("accepted_by_source") or {}
    acceptance = {
        source: (accepted.get(source, 0) / count if count else 0.0)
        for source, count in drafted.items()
    }
    return {
        "latencyMs": round(latency_ms, 3),
        "cached": cached,
        "source": source,
        "tokens": new_tokens,
        "tokensPerForward": float(stats.get("tokens_per_forward", 0.0) or 0.0),
        "targetForwards": int(stats.get("target_forwards", 0) or 0),
        "acceptanceBySource": acceptance,
        "acceptedBySource": dict(accepted),
        "draftedBySource": dict(drafted),
        "promptTokens": int(stats.get("prompt_tokens", 0) or 0),
        "prefillTokens": int(stats.get("prefill_tokens", 0) or 0),
        "reusedTokens": int(stats.get("reused_tokens", 0) or 0),
        # Where the reused tokens came from: another document's cache (the shared workspace
        # head), work done ahead (idle warm-up, didFocus), and this document's own requests.
        "reusedSharedTokens": int(stats.get("reused_shared_tokens", 0) or 0),
        "reusedWarmTokens": int(stats.get("reused_warm_tokens", 0) or 0),
        "reusedOwnTokens": int(stats.get("reused_own_tokens", 0) or 0),
        "mode": answer.mode if answer is not None else None,
        "stopReason": (answer.stop_reason if answer is not None else None)
        or stats.get("stop_reason"),
        # Milliseconds per pipeline stage of this request's own generation (none when it was
        # answered from work done before): context_ms, tokenize_ms, index_ms, prefill_ms,
        # decode_ms, postprocess_ms.
        "stagesMs": {} if cached or answer is None else dict(answer.stages),
        "engine": stats,
    }
