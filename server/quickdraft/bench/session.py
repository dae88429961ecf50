"""The bench's one door into the completion pipeline: a `Completer`, used as `serve` uses it.

Documents are opened with `set_document` (which also feeds the n-gram index), completions are
asked for with `complete`, and the peers get the very prompt ids `Completer` builds. The few
things a benchmark needs beyond what the server uses (a cold cache, a fixed draft length, the
prompt ids, post-processing of a peer's tokens) are asked of the Completer here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quickdraft.bench.holes import Hole
from quickdraft.config import QuickdraftConfig
from quickdraft.generation import CompletionRequest


@dataclass
class Outcome:
    """One completion of one hole by one strategy, in the bench's terms."""

    completion: str
    """What ends up at the cursor (token healing and auto-closed brackets accounted for)."""
    tokens: list[int]
    latency_ms: float
    prefill_ms: float | None
    decode_ms: float | None
    new_tokens: int
    target_forwards: int | None
    accepted_by_source: dict[str, int] | None = None
    drafted_by_source: dict[str, int] | None = None
    prompt_tokens: int | None = None
    prefill_tokens: int | None = None
    reused_tokens: int | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)
    """Milliseconds per pipeline stage (`Completion.stages`; empty for peers)."""
    repeated: bool | None = None
    """The raw output re-typed the existing line(s) after the cursor (None: not judged)."""
    repeat_trimmed: bool | None = None
    """Cutting that repeat changed what is shown."""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PeerPlan:
    """What a peer needs to answer the same request: prompt, budget, stop rule, post-processing."""

    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: frozenset[int]
    new_stop: Callable[[], Callable[[list[int]], bool] | None]
    """A fresh stop check per run (the server's stop rule keeps state while it reads)."""
    finish: Callable[[list[int]], str]
    """Tokens -> the text the server would insert (same post-processing as `complete`)."""
    build_ms: float
    """Time `Completer` took to build the prompt ids (added to peers' end-to-end latency)."""


def request_for(
    hole: Hole, text: str | None = None, line: int | None = None, col: int | None = None
):
    return CompletionRequest(
        uri=hole.uri,
        text=hole.text if text is None else text,
        line=hole.line if line is None else line,
        character=hole.col if col is None else col,
        language_id=hole.language,
    )


def insertion(completion: Any, text: str, offset: int) -> str:
    """The text a completion leaves at the cursor: what it replaces before the cursor (token
    healing) is taken off its start, and what it replaces after (an auto-closed bracket it
    re-types) off its end."""
    body = getattr(completion, "text", completion) or ""
    before = int(getattr(completion, "replace_before", 0) or 0)
    after = int(getattr(completion, "replace_after", 0) or 0)
    if before and body.startswith(text[offset - before : offset]):
        body = body[before:]
    tail = text[offset : offset + after]
    if after and tail and body.endswith(tail):
        body = body[: -len(tail)]
    return body


class Session:
    """A `Completer` plus the bench's bookkeeping of which documents are open."""

    def __init__(self, completer: Any) -> None:
        self.completer = completer
        self._open: list[str] = []
        self._base_config: QuickdraftConfig | None = getattr(completer, "config", None)

    # --- documents ----------------------------------------------------------------------

    def open(self, hole: Hole) -> None:
        """Open the hole's companions, then the hole's own document (the one being edited)."""
        self.close()
        for other in hole.open_files:
            self.completer.set_document(other.uri, other.text, other.language)
            self._open.append(other.uri)
        self.completer.set_document(hole.uri, hole.text, hole.language)
        self._open.append(hole.uri)
        # The other files were opened a while ago in the editor's life, so their tokens are
        # already in the n-gram index: index them now, untimed (the Completer indexes changed
        # documents lazily, at the next request). The current document is re-indexed inside
        # every timed request (see `touch`), as it is after each edit in `serve`.
        self.completer.refresh_documents()

    def touch(self, hole: Hole) -> None:
        """Make the hole's document "just edited", so the next request re-indexes it, as the
        first request after a keystroke does; every strategy then pays the same for it."""
        self.completer.close_document(hole.uri)
        self.completer.set_document(hole.uri, hole.text, hole.language)

    def close(self) -> None:
        for uri in reversed(self._open):
            self.completer.close_document(uri)
        self._open.clear()

    # --- settings -----------------------------------------------------------------------

    def set_draft_length(self, language: str, draft_length: int | None) -> None:
        """Fix the draft length for one language (None: back to the configuration's own)."""
        base = self._base_config
        if base is None:
            return
        languages = dict(base.languages)
        if draft_length is not None:
            own = base.language(language)
            languages[language] = dataclasses.replace(own, draft_length=draft_length)
        self._apply(dataclasses.replace(base, languages=languages))

    def _apply(self, config: QuickdraftConfig) -> None:
        update = getattr(self.completer, "update_config", None)
        if callable(update):
            update(config)
        else:
            self.completer.config = config

    # --- running ------------------------------------------------------------------------

    def reset_cache(self) -> None:
        """A cold start: no KV cache, and no memory of completions the engine generated for
        earlier runs (the n-gram drafter remembers recent completions, which would hand the
        next strategy this hole's answer)."""
        reset = getattr(self.completer.backend, "reset_cache", None)
        if callable(reset):  # a local engine's caches (a serving engine keeps its own)
            reset()

    def complete(
        self,
        hole: Hole,
        strategy: str,
        *,
        typed: int = 0,
        max_new_tokens: int | None = None,
        candidates: int = 1,
    ) -> Outcome:
        """Ask `Completer` for a completion at the hole (after typing `typed` characters of the
        truth), timed end to end as the language server's worker would see it. The typed-ahead
        cache is bypassed: every request reaches the engine. `candidates` > 1: then, untimed
        in the latency, its alternatives (`Completer.alternatives`), in `extra`."""
        if typed:
            text, line, col = hole.typed(typed)
            offset = hole.offset + len(hole.truth[:typed])
            self.completer.set_document(hole.uri, text, hole.language)
        else:
            text, line, col, offset = hole.text, hole.line, hole.col, hole.offset
            self.touch(hole)
        request = request_for(hole, text, line, col)
        started = time.perf_counter()
        completion = self.completer.complete(
            request, strategy=strategy, max_new_tokens=max_new_tokens
        )
        latency = (time.perf_counter() - started) * 1000
        alternatives = []
        if candidates > 1 and getattr(completion, "text", ""):
            for other in self.completer.alternatives(request, candidates - 1):
                alternatives.append(
                    {
                        "completion": insertion(other, text, offset),
                        "confidence": other.confidence,
                        "ready_ms": round(other.latency_ms, 3),
                        "decode_ms": round(other.stats.decode_ms, 3),
                        "prefill_tokens": other.stats.prefill_tokens,
                        "new_tokens": other.stats.new_tokens,
                        "target_forwards": other.stats.target_forwards,
                    }
                )
        if typed:
            self.completer.set_document(hole.uri, hole.text, hole.language)
        stats = getattr(completion, "stats", None)

        def stat(name: str, default=None):
            return getattr(stats, name, default) if stats is not None else default

        tokens = [int(t) for t in (getattr(completion, "tokens", None) or [])]
        return Outcome(
            completion=insertion(completion, text, offset),
            tokens=tokens,
            latency_ms=latency,
            prefill_ms=stat("prefill_ms"),
            decode_ms=stat("decode_ms"),
            new_tokens=int(stat("new_tokens", len(tokens))),
            target_forwards=stat("target_forwards"),
            accepted_by_source=dict(stat("accepted_by_source", {}) or {}),
            drafted_by_source=dict(stat("drafted_by_source", {}) or {}),
            prompt_tokens=stat("prompt_tokens"),
            prefill_tokens=stat("prefill_tokens"),
            reused_tokens=stat("reused_tokens"),
            stages_ms=dict(getattr(completion, "stages", None) or {}),
            repeated=getattr(completion, "repeated", None),
            repeat_trimmed=getattr(completion, "repeat_trimmed", None),
            extra={
                "stop_reason": getattr(completion, "stop_reason", None),
                "skipped": getattr(completion, "skipped", None),
                "confidence": getattr(completion, "confidence", None),
                "line_confidence": getattr(completion, "line_confidence", None),
                "alternatives": alternatives,
            },
        )

    def plan(self, hole: Hole, max_new_tokens: int | None = None) -> PeerPlan:
        """The request exactly as `Completer.complete` hands it to the engine (prompt ids, token
        budget, stop tokens, stop rule) and the post-processing it applies, for a peer."""
        completer = self.completer
        started = time.perf_counter()
        prepared = completer.prepare(request_for(hole), max_new_tokens=max_new_tokens)
        build_ms = (time.perf_counter() - started) * 1000
        stop_ids = frozenset(int(t) for t in (completer.models.stop_token_ids or ()))
        return PeerPlan(
            [int(t) for t in prepared.prompt_ids],
            int(prepared.max_new_tokens),
            stop_ids,
            prepared.stop_rule,
            lambda tokens: prepared.finish(tokens)[1],
            build_ms,
        )
