"""Work ahead of the user while the model worker is idle: warm-up, prefetch and next edits.

* Warm-up (cache.warmup) extends a document's KV caches toward the prompt its next request will
  likely send, at the cursor last seen there, or its file-level part when none is known. One
  target per document, the latest; documents are warmed one at a time, the focused or edited
  one first, and the person's focus (`textDocument/didFocus`) puts its document in front.
* Prefetch (cache.prefetch) computes the completion that follows accepting a suggestion (whole,
  and its first line) into the typed-ahead cache (typed_ahead.py): Tab, then the next request
  costs no model time.
* Next edits decided ahead (cache.warmup, once the client has asked for a next edit): after a
  change, the rules and the likelihood veto decide the document's next edit for that version
  (`next_edit.decide_rules`, cursor-free) before anything else in the background, as the
  editors ask only after the person rests (VS Code 600 ms, Neovim 500 ms): the request then
  takes the decision, or waits for the one running (service.py). It stops a running warm-up
  or stale decision (they go on later), never a prefetch; a job for the user stops it, and it
  is queued again while its version is the document's.

Both run as background jobs on the model worker (worker.py): only while nothing else waits, and
a job that must run for the user stops the one running (a decode step within one decoder
layer, a prefill chunk when it is done). Moving to another
document drops the other documents' queued prefetches and stops the running job, so the worker
warms where the person is now.

Threads: everything here runs on the event loop but the jobs, which get what they need of the
event loop's state as values taken there: a warm-up target holds the text, the place and the
language; a prefetch its CompletionRequest. What a job's outcome calls for (a stopped warm-up
is queued again, first unless the person has moved to another document; a prefetch's answer
goes into the typed-ahead cache) is decided on the event loop, in its done-callback. The
warm-up targets are the one place the two threads meet here: the event loop queues them, the
worker takes the first when it is free to warm, so the warm-up that runs is for the document in
front then (see `_targets_lock`).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quickdraft.admission import refusal
from quickdraft.errors import PositionError
from quickdraft.lsp.documents import completion_request, next_edit_request
from quickdraft.lsp.server_api import ServerApi
from quickdraft.lsp.typed_ahead import TypedAheadCache
from quickdraft.lsp.worker import describe_error
from quickdraft.text import position_after

if TYPE_CHECKING:
    from quickdraft.completer import Completion
    from quickdraft.generation import NextEditRequest

PREFETCH_SLOT = "#prefetch"
"""Suffix of the KV cache slot prefetches compute in: a text the user may never type must not
displace the caches of what they did type (the next keystroke would recompute it)."""


@dataclass(frozen=True)
class WarmTarget:
    """What a document's next warm-up computes toward, read on the event loop: the text, the
    cursor (`offset`; `line`, `column` in code points) and the language; `file_level`: no
    cursor is known, only the part of the prompt no cursor changes is computed."""

    text: str
    offset: int
    line: int
    column: int
    language_id: str
    file_level: bool

    @property
    def where(self) -> str:
        return "its file-level part" if self.file_level else f"at line {self.line + 1}"


@dataclass
class EditAhead:
    """A next edit being decided, or decided, ahead of its request."""

    version: int
    """The document's version it is for."""
    made_at: tuple
    """What else it read: the settings and every open document's version."""
    future: Future
    """The worker's job: `ModelHost.decide_edit`'s DecidedEdit, or None when stopped."""


class WorkAhead:
    """The server's work ahead: warm-up targets, the prefetches running, per document, and the
    next edits decided ahead."""

    def __init__(self, server: ServerApi, typed_ahead: TypedAheadCache):
        self.server = server
        self.typed_ahead = typed_ahead
        """Where a prefetch's answer goes (the completion service answers from it)."""
        self.focused: str | None = None
        """The document of the last `textDocument/didFocus`."""
        self._warm_targets: OrderedDict[str, WarmTarget] = OrderedDict()
        """uri -> each document's next warm-up, in the order they are warmed."""
        self._targets_lock = threading.Lock()
        """Guards `_warm_targets`: the event loop queues targets, the worker takes the first
        (`_warm_next`). The threads meet nowhere else here."""
        self._warming = False
        """A warm-up job is queued or running on the worker (one at a time; event loop only)."""
        self._prefetching: dict[str, dict[tuple[int, str], Future]] = {}
        """The prefetches queued or running per document: (offset, text) -> the worker's job."""
        self._warm_job: Future | None = None
        """The warm-up job queued or running."""
        self._edits_ahead: dict[str, EditAhead] = {}
        """uri -> its next edit decided ahead (the latest change's)."""
        self.asks_edits = False
        """The client has asked for a next edit (until then none is decided ahead: a client
        that never asks would only pay for them)."""

    # --- warm-up ----------------------------------------------------------------------

    def schedule_warm(self, uri: str, *, first: bool = True) -> None:
        """Idle warm-up (cache.warmup): extend `uri`'s KV caches toward the prompt its next
        request will likely send, at the cursor last seen there (an edit, a didFocus position,
        a request), or, when none is known, its file-level part. One target per document, the
        latest; documents are warmed one at a time while the worker is idle, `first` ones
        (the focused or edited document) ahead of the rest, and a real request stops the
        warm-up that is running after its prefill chunk."""
        document = self.server.documents.get(uri)
        config = self.server.config.current
        # A serving engine keeps no caches of ours to warm (RemoteBackend.warm does nothing):
        # building and tokenizing the prompt for it would be work for nothing. Before the models
        # are loaded nothing is warmed either: the load warms every open document when done.
        if document is None or not config.cache.warmup or not self.server.works_ahead:
            return
        at = document.cursor_at
        if at is not None and at <= len(document.text):
            line, column = document.line_column(at)
            target = WarmTarget(document.text, at, line, column, document.language_id, False)
        else:
            target = WarmTarget(document.text, 0, 0, 0, document.language_id, True)
        with self._targets_lock:
            self._warm_targets[uri] = target
            self._warm_targets.move_to_end(uri, last=not first)
        self._next_warm()

    def focus(self, uri: str, position: tuple[int, int] | None) -> None:
        """`textDocument/didFocus`: the person now looks at `uri` (at `position`, LSP units,
        when the client says): it is warmed first."""
        document = self.server.documents.get(uri)
        if document is None:
            self.server.log(f"didFocus for {uri}, which is not open; ignored", "warning")
            return
        if position is not None:
            line, character = position
            try:
                column = document.to_codepoint(line, character, strict=True)
            except PositionError as exc:
                self.server.log(
                    f"didFocus for {uri}: {exc}; warming its file-level part", "warning"
                )
            else:
                document.cursor_at = document.line_starts[line] + column
        if self.focused != uri:
            # Work ahead for the file left behind waits: the worker warms this one first.
            self.drop_prefetches(keep=uri)
            self.server.worker.preempt_background()
        self.focused = uri
        self.schedule_warm(uri, first=True)

    def warm_open_documents(self) -> None:
        """Warm every open document (fresh models hold no cache), the focused one first."""
        for uri in self.server.documents.uris():
            if uri != self.focused:
                self.schedule_warm(uri, first=False)
        if self.focused is not None:
            self.schedule_warm(self.focused, first=True)

    def forget(self, uri: str) -> None:
        """`uri` was closed: it is not warmed, its next edit is not decided, and it is no
        longer in focus."""
        with self._targets_lock:
            self._warm_targets.pop(uri, None)
        self.drop_edit(uri)
        if self.focused == uri:
            self.focused = None

    def _next_warm(self) -> None:
        """Start the next document's warm-up unless one is queued or running."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a server driven by hand (unit tests): no work ahead
            return
        if self._warming:
            return
        with self._targets_lock:
            if not self._warm_targets:
                return
        self._warming = True
        future = self._warm_job = self.server.worker.submit_background(self._warm_next)

        def warmed(done) -> None:
            loop.call_soon_threadsafe(self._warmed, done)

        future.add_done_callback(warmed)

    def _warmed(self, done) -> None:  # event loop
        self._warming = False
        if done.cancelled() or self.server.worker.stopped:
            return
        if done.exception() is not None:
            # Left queued: the next edit or focus starts warming again.
            self.server.log(f"warm-up failed: {describe_error(done.exception())}", "warning")
            return
        uri, target, computed, stopped = done.result()
        if stopped:  # a request or a focus elsewhere came first: go on later
            with self._targets_lock:
                if uri not in self._warm_targets:
                    self._warm_targets[uri] = target
                    # first again, unless the person has moved to another document
                    self._warm_targets.move_to_end(uri, last=self.focused not in (None, uri))
        if computed and stopped:
            self.server.log(
                f"warm-up: stopped after {computed} tokens of {uri} ({target.where}); the rest"
                " later",
                "log",
            )
        elif computed:
            self.server.log(
                f"warm-up: {computed} tokens of {uri} computed ahead ({target.where})", "log"
            )
        self._next_warm()

    def _warm_next(self, cancel) -> tuple[str | None, WarmTarget | None, int, bool]:
        """(worker thread, background) Warm the first document queued: (its uri, its target,
        the tokens computed, whether `cancel` stopped it)."""
        with self._targets_lock:
            if not self._warm_targets:
                return None, None, 0, False
            uri, target = self._warm_targets.popitem(last=False)
        if self.server.host.completer is None:
            return uri, target, 0, False
        request = completion_request(
            uri, target.language_id, target.text, target.offset, target.line, target.column
        )
        computed = self.server.host.warm(request, cancel, file_level=target.file_level)
        return uri, target, computed, cancel.is_set()

    # --- next edits decided ahead ---------------------------------------------------------

    def decide_edit(self, uri: str) -> None:
        """`uri` changed: decide its next edit for the new version in the background, ahead
        of the other work queued, stopping a running warm-up or an earlier decision (they
        go on later). A newer change replaces it."""
        document = self.server.documents.get(uri)
        config = self.server.config.current
        previous = self._edits_ahead.pop(uri, None)
        if previous is not None and not previous.future.cancel():
            self.server.worker.preempt_background(previous.future)
        if (
            document is None
            or not self.asks_edits
            or not self.server.works_ahead
            or not config.cache.warmup
            or not config.edits.rules
            or refusal(config, "edit", document.language_id, document.text) is not None
        ):
            return
        offset = document.cursor_at if document.cursor_at is not None else 0
        request = next_edit_request(
            self.server.documents, document, offset, config.edits.history_files
        )
        self._submit_edit(uri, document.version, self._made_at(), request)

    def _made_at(self) -> tuple:
        """The settings (the object: a change of settings is a new one) and every open
        document's version."""
        return (self.server.config.current, self.server.documents.versions())

    def _submit_edit(
        self, uri: str, version: int, made_at: tuple, request: NextEditRequest
    ) -> None:
        """Queue the decision's job first; stop the warm-up running (it goes on after)."""
        worker = self.server.worker
        future = worker.submit_background(self.server.host.decide_edit, request, first=True)
        ahead = self._edits_ahead[uri] = EditAhead(version, made_at, future)
        if self._warm_job is not None:
            worker.preempt_background(self._warm_job)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a server driven by hand (unit tests)
            return

        def done(future: Future) -> None:
            loop.call_soon_threadsafe(self._edit_decided, uri, ahead, request)

        ahead.future.add_done_callback(done)

    def _edit_decided(
        self, uri: str, ahead: EditAhead, request: NextEditRequest
    ) -> None:  # event loop
        """A decision ahead ended: one a job for the user stopped is queued again while it
        is still the document's latest (its finished windows are kept: `Engine.likelihoods`)."""
        future = ahead.future
        if self._edits_ahead.get(uri) is not ahead or self.server.worker.stopped:
            return
        if future.cancelled():
            return
        if future.exception() is not None:
            self.server.log(
                f"next edit of {uri} ahead: {describe_error(future.exception())}", "warning"
            )
            return
        decided = future.result()
        if decided is not None:
            if not decided.decision.candidates:  # most keystrokes: nothing worth a line
                return
            shown = decided.decision.shown
            self.server.log(
                f"next edit of {uri} (version {ahead.version}) decided ahead: "
                + (f"rule {shown.rule}" if shown is not None else "none")
                + f" ({decided.decision.candidates} candidates,"
                f" {decided.decision.scored} scored)",
                "log",
            )
            return
        if ahead.made_at != self._made_at():
            del self._edits_ahead[uri]
            return
        self._submit_edit(uri, ahead.version, ahead.made_at, request)

    def edit_decided(self, uri: str, version: int) -> Future | None:
        """The job deciding `uri`'s next edit at `version` ahead, as things still stand (the
        settings and the other documents as it read them); None without one."""
        ahead = self._edits_ahead.get(uri)
        if ahead is None or ahead.version != version or ahead.made_at != self._made_at():
            return None
        return ahead.future

    def drop_edit(self, uri: str) -> None:
        """Forget `uri`'s decision ahead (the request decides itself); a queued one never runs."""
        ahead = self._edits_ahead.pop(uri, None)
        if ahead is not None:
            ahead.future.cancel()

    # --- prefetch: the completion after accepting a suggestion ---------------------------

    def prefetch(
        self,
        uri: str,
        language_id: str,
        text: str,
        offset: int,
        line: int,
        column: int,
        suggestion: str,
    ) -> None:
        """Compute, in the background, the completion that follows accepting `suggestion`
        whole (and its first line, when it has several), and keep it in the typed-ahead cache:
        Tab then the next request costs no model time. A request of the user's stops it."""
        accepted = [suggestion]
        if "\n" in suggestion.strip("\n"):
            accepted.append(suggestion.split("\n", 1)[0])
        for inserted in accepted:
            new_text = text[:offset] + inserted + text[offset:]
            new_line, new_column = position_after(line, column, inserted)
            self.prefetch_at(
                uri, language_id, new_text, offset + len(inserted), new_line, new_column
            )

    def prefetch_at(
        self, uri: str, language_id: str, text: str, offset: int, line: int, column: int
    ) -> None:
        """Compute the completion at `offset` of `text` in the background, into the typed-ahead
        cache."""
        # The document's own caches keep what is typed.
        request = completion_request(
            uri, language_id, text, offset, line, column, slot=uri + PREFETCH_SLOT
        )
        key = (offset, text)
        loop = asyncio.get_running_loop()
        future = self.server.worker.submit_background(self.server.host.complete, request)
        running = self._prefetching.setdefault(uri, {})
        running[key] = future

        def finished() -> None:
            if running.get(key) is future:
                del running[key]

        def done(fut, prefix=text[:offset], suffix=text[offset:]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                loop.call_soon_threadsafe(finished)
                return
            completion = fut.result()
            if completion is None or completion.stop_reason == "cancelled":
                loop.call_soon_threadsafe(finished)
                return
            loop.call_soon_threadsafe(self._prefetched, uri, prefix, suffix, completion, key)

        future.add_done_callback(done)

    def is_prefetching(self, uri: str, offset: int, text: str) -> bool:
        """Whether the completion at `offset` of `text` is being prefetched (queued or running)."""
        return (offset, text) in self._prefetching.get(uri, {})

    def prefetch_of(self, uri: str, offset: int, text: str) -> Future | None:
        """The worker's job prefetching the completion at `offset` of `text` (queued, running
        or just done), for a request there to wait for instead of computing it again."""
        job = self._prefetching.get(uri, {}).get((offset, text))
        return None if job is None or job.cancelled() else job

    def drop_prefetches(self, keep: str) -> int:
        """The person moved to `keep`: other documents' queued prefetches are not run (the
        running one stops through its cancel event, `ModelWorker.preempt_background`), so the
        worker warms where they are now. Returns how many were dropped."""
        dropped = 0
        for uri, running in self._prefetching.items():
            if uri == keep:
                continue
            for key, job in list(running.items()):
                if job.cancel():
                    dropped += 1
                    del running[key]
        return dropped

    def cancel_prefetches(self, uri: str) -> None:
        """`uri`'s queued prefetches are not run (its text is not what they assumed)."""
        for job in self._prefetching.pop(uri, {}).values():
            job.cancel()

    def _prefetched(
        self, uri: str, prefix: str, suffix: str, completion: Completion, key: tuple[int, str]
    ) -> None:
        running = self._prefetching.get(uri, {})
        if key in running and running[key].done():  # not a newer job for the same spot
            del running[key]
        self.typed_ahead.remember(
            uri, prefix, completion.text, suffix, "prefetch", confidence=completion.confidence
        )
        what = f"{len(completion.text)} chars" if completion.text else "nothing to add"
        prefill = completion.stats.prefill_tokens
        self.server.log(
            f"prefetch: {what} ready for {uri} after accepting a suggestion "
            f"({prefill} tokens prefilled)",
            "log",
        )
