"""What the two pipelines hand a backend and get back, and the one generation step they share.

    completer.Completer (completions) --\
                                         >-- a prepared request --> Backend --> Generated
    next_edit (next edits) ------------/

The request types (`CompletionRequest`, `NextEditRequest`), what each pipeline prepares of them
for a backend (`PreparedCompletion`, `PreparedEdit`: the prompt's tokens, the budget, the stop
rule), what a backend gives back (`Generated`) and the `Backend` protocol itself live here, so a
backend (local_backend, remote) is read and tested without either pipeline, and neither pipeline
knows the other. `generate_step` is the step both pipelines run: it owns the deadline, passes the
cancel event on, and times the generation as the pipeline's stages (`StageClock`).

Nothing here imports torch or a model: the language server imports these types at once, before
the worker loads the models.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from quickdraft.config import DecodingConfig, QuickdraftConfig
from quickdraft.context import OpenDocument, Prompt
from quickdraft.context.cursor import CursorContext
from quickdraft.context.edit_history import Hunk
from quickdraft.context.edit_prompt import EditableRegion, EditPrompt, overrun_start
from quickdraft.context.prompt import offset_of
from quickdraft.postprocess import StopRule, finalize
from quickdraft.tokens import PromptTokenizer

if TYPE_CHECKING:
    from quickdraft.decoding import GenerationStats
    from quickdraft.decoding.confidence import TokenChoice

EDIT_SLOT = "#edit"
"""Suffix of the KV cache slot next edits compute in: their prompt shares nothing with the
document's completion prompt, whose cache must stay for the next keystroke."""
STOP_TAIL_TOKENS = 12
"""A next edit's stop rule decodes only this many of the last tokens to look for the closing
marker."""


# --- completions -----------------------------------------------------------------------------


@dataclass
class CompletionRequest:
    uri: str
    text: str
    line: int
    character: int
    language_id: str | None = None
    offset: int | None = None
    """The cursor's index into `text`, when the caller knows it (the language server does):
    then nothing reads the whole text to find it."""
    slot: str | None = None
    """The KV cache slot to compute in (default: the document's own). Work done for a text
    the user may never type (prefetch) uses another, so the document's caches keep what the
    user has really typed."""
    min_confidence: float = 0.0
    """The confidence under which the answer would not be shown (`decoding.min_confidence`
    for a suggestion the editor asked for by itself; 0 when the person asked): a local
    engine stops writing once its tokens are less likely than this, and the answer is empty
    (its `stop_reason` "unsure")."""


@dataclass
class PreparedCompletion:
    """A request turned into what the engine gets, and the post-processing of its answer."""

    request: CompletionRequest
    prompt: Prompt
    prompt_ids: list[int]
    before_cursor: list[int]
    """The prompt's tokens of the text before the cursor (what the new tokens continue)."""
    after_cursor: list[int]
    """The prompt's tokens of the text after the cursor."""
    anchored_draft: list[int] | None
    """What followed the text before the cursor in an open document, as tokens."""
    mode: str
    """"line" or "block" (postprocess.decide_mode)."""
    max_new_tokens: int
    tokenizer: Any
    context: CursorContext
    """The text around the cursor as the post-processing rules read it (read once)."""
    healed: str = ""
    """Token healing: characters before the cursor taken off the prompt, which the completion
    writes first (they are in the document already, so they are not inserted)."""

    def text_stop_rule(self) -> StopRule:
        """A fresh stop rule for one generation: text so far -> complete now?"""
        return StopRule(self.context, self.mode)

    def inserted(self, text: str) -> str | None:
        """What generated `text` inserts at the cursor (the healed characters off its start);
        None while it has not written them all yet."""
        if not self.healed:
            return text
        return text[len(self.healed) :] if text.startswith(self.healed) else None

    def stop_rule(self) -> Callable[[list[int]], bool]:
        """A fresh stop callback for one generation: new tokens so far -> complete now?"""
        rule = self.text_stop_rule()

        def stop(tokens: list[int]) -> bool:
            text = self.inserted(self.tokenizer.decode(tokens, skip_special_tokens=True))
            return text is not None and rule(text)

        return stop

    def finish(self, tokens: list[int]) -> tuple[str, str]:
        """(raw text inserted at the cursor, the text to insert after post-processing)."""
        text = self.inserted(self.tokenizer.decode(tokens, skip_special_tokens=True))
        return self.finish_text(text or "")

    def finish_text(self, raw: str) -> tuple[str, str]:
        """(raw text, the text to insert after post-processing)."""
        return raw, finalize(raw, self.context, self.mode)


def cursor_offset(request: CompletionRequest | NextEditRequest) -> int:
    """The request's cursor as an index into its text (reads the text up to the cursor's line
    when the caller did not say)."""
    if request.offset is not None:
        return request.offset
    return offset_of(request.text, request.line, request.character)


# --- next edits ------------------------------------------------------------------------------


@dataclass
class NextEditRequest:
    uri: str
    text: str
    line: int
    character: int
    """The cursor, 0-based line and code point column."""
    language_id: str | None = None
    offset: int | None = None
    """The cursor's index into `text`, when the caller knows it."""
    hunks: Sequence[Hunk] = ()
    """This document's recent edits, oldest first (context.edit_history)."""
    other_hunks: Sequence[Hunk] = ()
    """Other documents' recent edits, oldest first (the document edited last, last)."""
    edited_elsewhere_since: bool = False
    """Another document was edited after this one's latest hunk (its latest edit is the last
    of `other_hunks`)."""


@dataclass
class PreparedEdit:
    """A next-edit request turned into what the backend gets."""

    request: NextEditRequest
    region: EditableRegion
    prompt: EditPrompt
    prompt_ids: list[int]
    copy_source: list[int]
    """The region as it stands (and the answer's closing), as tokens: most of the answer."""
    max_new_tokens: int
    tokenizer: Any

    @property
    def slot(self) -> str:
        return self.request.uri + EDIT_SLOT

    def text_stop_rule(self) -> Callable[[str], bool]:
        """Text so far -> has the region been written out (closed, or written past)?"""
        prompt, region = self.prompt, self.region
        return lambda text: prompt.closed(text) or overrun_start(region, text) is not None

    def stop_rule(self) -> Callable[[list[int]], bool]:
        """New tokens so far -> has the region been written out (closed, or written past)?
        (Decodes the tail for the closing marker, a few tokens long, and the whole answer,
        well under a millisecond, when that tail holds a line break: an overrun starts on a
        line of its own.)"""
        prompt, region, decode = self.prompt, self.region, self.tokenizer.decode

        def stop(tokens: list[int]) -> bool:
            if len(tokens) <= STOP_TAIL_TOKENS:
                text = decode(tokens, skip_special_tokens=False)
                return prompt.closed(text) or overrun_start(region, text) is not None
            tail = decode(tokens[-STOP_TAIL_TOKENS:], skip_special_tokens=False)
            if prompt.closing in tail:
                return True
            if "\n" not in tail:
                return False  # a line is still being written: nothing new to judge
            return overrun_start(region, decode(tokens, skip_special_tokens=False)) is not None

        return stop


# --- backends --------------------------------------------------------------------------------


@dataclass
class Generated:
    """What a backend wrote for a prepared request, before post-processing."""

    raw_text: str
    """What the generation inserts at the cursor (healed characters already off its start)."""
    tokens: list[int]
    stop_reason: str
    """"eos" | "max_tokens" | "stop" | "unsure" | "deadline" | "cancelled"."""
    stats: GenerationStats
    choices: list[TokenChoice] = field(default_factory=list)
    """Per token, the target's log-probability of it and its runner-up; empty where the
    backend cannot say."""


class Models(Protocol):
    """The models a backend generates with, as the pipelines see them."""

    tokenizer: Any
    family: str
    """The FIM family (context.fim), which sets the prompt's markers."""
    preset: Any
    """The preset they came from (models.presets.Preset), or None."""

    def summary(self) -> str:
        """One line for logs and status items."""
        ...

    def describe(self) -> dict[str, Any]:
        """What was loaded, for `$/quickdraft/stats` and the bench's report."""
        ...

    def names(self) -> list[str]:
        """The names the model is known by (its preset, its reference, what an engine says
        it serves): a next edit's prompt format is chosen by them."""
        ...


class EngineState(Protocol):
    """A serving engine's state as the server follows it (remote.status.EngineStatus)."""

    def subscribe(self, listener: Callable[[str, str], None]) -> tuple[str, str]:
        """Hear every later change (state, message; on any thread); returns them as they are
        now."""
        ...


class Backend(Protocol):
    """What generates for the pipelines. They know backends only by this."""

    models: Models
    prompts: PromptTokenizer
    """Prompts into tokens with the models' tokenizer, part by part (cached)."""

    def configure(self, config: QuickdraftConfig) -> QuickdraftConfig:
        """Take new settings; returns them as this backend honours them."""
        ...

    def index_documents(
        self, documents: Mapping[str, OpenDocument], current: CompletionRequest | None
    ) -> None:
        """The open documents, before a request at `current` (or untimed, with None): the
        local backend drafts from them; a serving engine drafts for itself."""
        ...

    def forget_document(self, uri: str) -> None:
        """A document closed: drop what is kept of it."""
        ...

    def generate(
        self,
        prepared: PreparedCompletion,
        *,
        strategy: str | None,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> Generated: ...

    def generate_edit(
        self,
        prepared: PreparedEdit,
        *,
        strategy: str | None,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> Generated:
        """A next edit's rewrite of its region: the prompt as it is, stopped by its rule,
        `raw_text` the text written (special tokens left out)."""
        ...

    def alternatives(
        self,
        prepared: PreparedCompletion,
        generated: Generated,
        count: int,
        *,
        within: int,
        cancel: threading.Event | None,
    ) -> list[Generated]:
        """Up to `count` other answers to `prepared`, whose greedy answer `generated` the
        backend just gave, branching within its first `within` tokens; [] where the backend
        cannot fork its answer (a serving engine)."""
        ...

    def warm(self, prepared: PreparedCompletion, cancel: threading.Event | None) -> int:
        """Compute ahead the caches this request will need; the tokens computed."""
        ...

    def likelihoods(
        self,
        prompt_ids: Sequence[int],
        continuations: Sequence[Sequence[int]],
        *,
        slot: str,
        model: str,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> list[list[float]] | None:
        """`model`'s log-probability ("target", or "draft" where one is loaded) of each token
        of each continuation after `prompt_ids` (the prompt computed once, in cache slot
        `slot`): what the next-edit likelihood veto compares. None where the backend cannot
        score (a serving engine), or when `cancel` or `deadline` stopped it."""
        ...

    def fill(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        ended: Callable[[str], bool],
        slot: str,
        language_id: str | None,
        cancel: threading.Event | None,
    ) -> Generated | None:
        """The target's greedy text after `prompt_ids` (a fill-in-the-middle prompt), at most
        `max_new_tokens` tokens, stopped once `ended` finds the text written so far complete,
        in cache slot `slot`: what a next edit's rule holds open (an added parameter's
        argument). None where the backend does not write these (a serving engine), or when
        `cancel` stopped it."""
        ...

    def prefill(
        self, prompt_ids: Sequence[int], *, slot: str, model: str, cancel: threading.Event | None
    ) -> int:
        """Compute ahead `model`'s cache of the head that later `likelihoods` prompts in
        `slot`'s place will start with (they adopt it); the tokens computed (0 where the
        backend scores nothing)."""
        ...

    @property
    def compute(self) -> dict[str, Any]:
        """How the models run and why (for `$/quickdraft/stats` and the log)."""
        ...

    @property
    def compute_path(self) -> str | None:
        """What computes, as identity is reported per path (None: not on this machine)."""
        ...

    @property
    def batch_invariant(self) -> bool:
        """Whether every greedy strategy is token-identical to `ar` by construction."""
        ...

    @property
    def engine_status(self) -> EngineState | None:
        """A serving engine's state, which the server shows and follows ("ready",
        "unavailable"); None for this machine's models (their state is the load's)."""
        ...

    @property
    def works_ahead(self) -> bool:
        """Whether work ahead of the person pays here (idle warm-up, prefetch, alternatives):
        caches of this machine's engine. A serving engine's capacity is for the requests of
        everyone who shares it."""
        ...

    def close(self) -> None: ...


class ModelAnswer(Protocol):
    """What both pipelines' answers (completer.Completion, next_edit.NextEdit) say of the model's
    work: the language server reports either by this."""

    tokens: list[int]
    """The tokens generated (none: answered without generating)."""
    stats: GenerationStats
    stop_reason: str
    mode: str
    """"line" or "block" (a completion), "edit" or "rule" (a next edit)."""
    stages: dict[str, float]
    """Milliseconds per pipeline stage."""
    skipped: str | None
    """Why no generation was attempted (the gate's reason), or None."""
    confidence: float | None
    """The model's (or a rule's) probability of what is shown, where known."""


class StageClock:
    """Milliseconds per pipeline stage, as llm-ls logs them: a slow stage shows where it is."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        """The time since the previous lap (or the start) was spent in `stage`."""
        now = time.perf_counter()
        self.stages[stage] = round(self.stages.get(stage, 0.0) + (now - self._last) * 1000, 2)
        self._last = now


# --- the step both pipelines run --------------------------------------------------------------


def generate_step(
    generate: Callable[[float | None], Generated],
    decoding: DecodingConfig,
    clock: StageClock,
) -> Generated:
    """Run one generation (`generate(deadline)`: the backend's call, with the request's cancel
    event bound in) under `decoding.deadline_ms`, timed as the clock's `generate_ms` stage."""
    deadline = time.monotonic() + decoding.deadline_ms / 1000 if decoding.deadline_ms else None
    generated = generate(deadline)
    clock.lap("generate_ms")
    return generated


def stages_of(clock: StageClock, stats: GenerationStats) -> dict[str, float]:
    """The clock's stages with generation split as the backend measured it: `prefill_ms`, and
    `decode_ms` for the rest (what the backend did not account for, its own bookkeeping, stays
    with decode, so the stages add up to the latency), in the order they ran."""
    stages: dict[str, float] = {}
    for stage, ms in clock.stages.items():
        if stage == "generate_ms":
            stages["prefill_ms"] = round(stats.prefill_ms, 2)
            stages["decode_ms"] = round(max(0.0, ms - stats.prefill_ms), 2)
        else:
            stages[stage] = ms
    return stages
