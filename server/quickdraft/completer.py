"""The completion pipeline shared by `quickdraft complete`, `quickdraft serve` and the bench:

    document -> should_complete -> build_prompt -> tokenize (token healing) -> generate
             (stop rule inside) -> finalize

One pipeline, whatever generates: the `Completer` is handed a `Backend` (composition, as llm-ls
gives each backend plain functions) and knows nothing else about it. Two exist:
`local_backend.LocalBackend` (the decoding engine on this machine, its KV caches and n-gram
index) and `remote.RemoteBackend` (a serving engine); `backends.load_completer` picks one by
`model.backend`. The Completer owns the open documents and the prompt; it knows nothing about
LSP: positions are 0-based lines and Python string offsets.

Threads: a Completer belongs to one thread (the language server's model worker; the CLI's and
the bench's main thread). Nothing in it is locked.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from quickdraft.admission import refusal
from quickdraft.config import QuickdraftConfig
from quickdraft.context import OpenDocument, Prompt, build_prompt
from quickdraft.context.continuation import find_continuation
from quickdraft.context.cursor import CursorContext
from quickdraft.context.prompt import TokenCounter
from quickdraft.context.snippets import uri_to_path
from quickdraft.context.workspace import WorkspaceHead
from quickdraft.decoding import GenerationStats
from quickdraft.decoding.confidence import confidence
from quickdraft.generation import (
    Backend,
    CompletionRequest,
    EngineState,
    Generated,
    PreparedCompletion,
    StageClock,
    cursor_offset,
    generate_step,
    stages_of,
)
from quickdraft.postprocess import Finished, decide_mode, finish
from quickdraft.text import split_lines, unusable_reason, without_lone_surrogates


@dataclass
class Completion:
    text: str
    """What to insert at the cursor, post-processed."""
    tokens: list[int] = field(default_factory=list)
    """Generated token ids (before post-processing trimmed the text)."""
    raw_text: str = ""
    mode: str = "line"
    stop_reason: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)
    confidence: float | None = None
    """The target's probability of the tokens shown (decoding.confidence); None where the
    backend cannot say (a serving engine) or nothing is shown; for an answer stopped "unsure"
    (`CompletionRequest.min_confidence`), of the tokens it wrote before it stopped."""
    line_confidence: float | None = None
    """The same over the tokens of the shown text's first line, where it has more than one
    (and the first is not empty); None otherwise."""
    prompt_tokens: int = 0
    latency_ms: float = 0.0
    skipped: str | None = None
    """Why no completion was attempted (language disabled, document too large, binary)."""
    repeated: bool = False
    """The model's output re-typed the existing line(s) after the cursor (the stop rule cut
    them: a suggestion never repeats what the document already has)."""
    repeat_trimmed: bool = False
    """Cutting the repeat changed what is shown (else the repeat would have been shown)."""
    stages: dict[str, float] = field(default_factory=dict)
    """Milliseconds per pipeline stage: context_ms (the prompt and the cursor's context),
    tokenize_ms, index_ms (open documents into the n-gram index), prefill_ms, decode_ms,
    postprocess_ms."""


ANCHORED_DRAFT_TOKENS = 64
"""The most tokens of an open document's text proposed from the cursor on."""
CONTINUATION_WINDOW = 4096
"""How much of the text before the cursor the continuation lookup matches on (it needs its
last few hundred characters)."""


def _readable(request: CompletionRequest) -> CompletionRequest:
    """The request with lone surrogates in its text replaced (offsets unchanged): a tokenizer
    cannot encode them, and one odd character must not cost the whole completion."""
    clean = without_lone_surrogates(request.text)
    return request if clean is request.text else dataclasses.replace(request, text=clean)


@dataclass
class _Answered:
    """A document's last answer from the model, kept for its alternatives."""

    prepared: PreparedCompletion
    generated: Generated
    shown: str
    within: int

    def serves(self, request: CompletionRequest) -> bool:
        """Whether `request` asks at the same place of the same text."""
        asked = self.prepared.request
        return (
            request.text == asked.text
            and cursor_offset(request) == cursor_offset(asked)
            and request.language_id == asked.language_id
        )


def scored_spans(
    prepared: PreparedCompletion, tokens: list[int], shown: str
) -> tuple[int, int | None]:
    """(the tokens that write `shown`, those that write its first line where it has more than
    one and the first is not empty, else None), in one pass (`shown_tokens`)."""
    first_line = shown.split("\n", 1)[0]
    if "\n" not in shown or not first_line.strip():
        return shown_tokens(prepared, tokens, shown)[0], None
    within, line = shown_tokens(prepared, tokens, shown, first_line)
    return within, line


def _completion(
    prepared: PreparedCompletion,
    generated: Generated,
    shown: Finished,
    spans: tuple[int, int | None],
    started: float,
    stages: dict[str, float] | None = None,
) -> Completion:
    """What a generation shows: `shown`, scored on the tokens that write it and its first line
    (`spans`, from `scored_spans`)."""
    score = line_score = None
    within, line_tokens = spans
    if generated.choices and shown.text:
        score = confidence(generated.choices[:within])
        if line_tokens is not None:
            line_score = confidence(generated.choices[:line_tokens])
    return Completion(
        text=shown.text,
        repeated=shown.repeated,
        repeat_trimmed=shown.changed,
        tokens=generated.tokens,
        raw_text=generated.raw_text,
        mode=prepared.mode,
        stop_reason=generated.stop_reason,
        stats=generated.stats,
        confidence=score,
        line_confidence=line_score,
        prompt_tokens=len(prepared.prompt_ids),
        latency_ms=(time.perf_counter() - started) * 1000,
        stages=stages or {},
    )


def shown_tokens(prepared: PreparedCompletion, tokens: list[int], *shown: str) -> list[int]:
    """For each of `shown` (post-processed texts, or parts of one from its start), how many of
    `tokens` it takes to write it: the tokens a suggestion's confidence is scored on and its
    alternatives branch within. Post-processing only cuts a suggestion's end, so this is the
    shortest run whose text reaches it. One pass over the prefixes serves every text."""
    wants = [len(text.rstrip()) for text in shown]
    counts = [0 if want == 0 else None for want in wants]
    for n in range(1, len(tokens) + 1):
        if all(count is not None for count in counts):
            break
        text = prepared.inserted(prepared.tokenizer.decode(tokens[:n], skip_special_tokens=True))
        if text is None:
            continue
        written = len(text.rstrip())
        counts = [
            n if c is None and written >= w else c for c, w in zip(counts, wants, strict=True)
        ]
    return [len(tokens) if count is None else count for count in counts]


class Completer:
    def __init__(self, backend: Backend, config: QuickdraftConfig | None = None) -> None:
        self.backend = backend
        self.models = backend.models
        self.config = backend.configure(config or QuickdraftConfig())
        self.tokenizer = self.models.tokenizer
        self.prompts = backend.prompts
        self.template = self.prompts.template
        self.count_tokens = TokenCounter(self.prompts.cache.count)
        self.documents: OrderedDict[str, OpenDocument] = OrderedDict()
        """Open documents, least recently changed first (their order in the prompt)."""
        self.root: str | None = None
        """The workspace folder prompts show paths relative to (the language server sets it)."""
        self.head = WorkspaceHead()
        """The chunks every document's prompt starts with (`context.head: workspace`)."""
        self._answered: dict[str, _Answered] = {}
        """Per document, its last answer from the model: what `alternatives` forks."""

    @property
    def compute(self) -> dict[str, Any]:
        return self.backend.compute

    @property
    def compute_path(self) -> str | None:
        return self.backend.compute_path

    @property
    def batch_invariant(self) -> bool:
        return self.backend.batch_invariant

    @property
    def works_ahead(self) -> bool:
        return self.backend.works_ahead

    @property
    def engine_status(self) -> EngineState | None:
        return self.backend.engine_status

    def describe(self) -> str:
        """One line for logs and status items: the models and how they run."""
        return self.models.summary()

    def close(self) -> None:
        """Release what the backend holds (llama.cpp's contexts, a serving engine's
        connections); the Completer is not used afterwards."""
        self.backend.close()

    def update_config(self, config: QuickdraftConfig) -> None:
        """Apply new settings; model settings are the loader's business, not this one's."""
        self.config = self.backend.configure(config)

    # --- documents -------------------------------------------------------------------------

    def set_document(self, uri: str, text: str, language_id: str | None = None) -> None:
        """Open or change a document. The backend sees it at the next request; a changed
        document moves to the end of the prompt's other files."""
        text = without_lone_surrogates(text)
        known = self.documents.get(uri)
        if known is not None and known.text == text and known.language_id == language_id:
            return
        self.documents[uri] = OpenDocument(
            path=uri_to_path(uri), text=text, language_id=language_id
        )
        self.documents.move_to_end(uri)
        context = self.config.context
        self.head.add(
            uri,
            uri_to_path(uri),
            text,
            language_id,
            lines=context.snippet_lines,
            max_bytes=context.max_document_bytes,
        )

    def close_document(self, uri: str) -> None:
        self.documents.pop(uri, None)
        for slot in [
            s for s, answered in self._answered.items() if answered.prepared.request.uri == uri
        ]:
            del self._answered[slot]
        self.head.remove(uri)
        self.backend.forget_document(uri)

    def refresh_documents(self, current: CompletionRequest | None = None) -> None:
        """Show the backend the open documents now (it indexes what changed for n-gram
        drafting); the document being completed in (`current`) is split at the cursor."""
        self.backend.index_documents(self.documents, current)

    # --- the pipeline ----------------------------------------------------------------------

    def should_complete(self, request: CompletionRequest) -> str | None:
        """None if the request should be answered by the model, else the reason not to (the
        one gate, `admission.refusal`)."""
        refused = refusal(self.config, "completion", request.language_id, request.text)
        return None if refused is None else refused.reason

    def _other_documents(self, uri: str) -> list[tuple[str, OpenDocument]]:
        """The open documents but `uri`'s that can be context (not too large, not binary),
        by uri: `prepare` reads them once for the prompt and the anchored draft."""
        max_bytes = self.config.context.max_document_bytes
        return [
            (other, doc)
            for other, doc in self.documents.items()
            if other != uri and unusable_reason(doc.text, max_bytes) is None
        ]

    def build_prompt(
        self,
        request: CompletionRequest,
        others: list[tuple[str, OpenDocument]] | None = None,
    ) -> Prompt:
        """The request's prompt. `others`: the other documents it may show
        (`_other_documents`, which `prepare` reads once for this and the anchored draft); None:
        read them here. With the workspace head, context.prompt decides where the file's own
        chunk goes."""
        context = self.config.context
        if others is None:
            others = self._other_documents(request.uri)
        workspace = context.head == "workspace"
        return build_prompt(
            request.text,
            request.line,
            request.character,
            request.language_id,
            [doc for _, doc in others],
            self.template,
            self.count_tokens,
            context,
            path=uri_to_path(request.uri),
            offset=request.offset,
            root=self.root,
            head=self.head.snippets() if workspace else None,
            own_chunk=self.head.chunk_of(request.uri) if workspace else None,
        )

    def anchored_draft(
        self,
        request: CompletionRequest,
        others: list[tuple[str, OpenDocument]],
        healed: str = "",
    ) -> list[int] | None:
        """What followed the text before the cursor in this document or one of `others`
        (context.continuation), as the tokens the model would write for it, starting with the
        `healed` characters the completion must write first; None when there is nothing to
        propose."""
        offset = cursor_offset(request)
        sources = [(uri, doc.text, None) for uri, doc in others]
        window_start = max(0, offset - CONTINUATION_WINDOW)
        found = find_continuation(
            request.text[window_start:offset],
            [(request.uri, request.text, offset), *sources],
        )
        if found is None and not healed:
            return None
        text = healed + (found.text if found is not None else "")
        return list(self.prompts.cache.ids(text))[:ANCHORED_DRAFT_TOKENS] or None

    def prepare(
        self,
        request: CompletionRequest,
        *,
        max_new_tokens: int | None = None,
        clock: StageClock | None = None,
    ) -> PreparedCompletion:
        """Everything `complete` hands the backend and applies after it, without generating.

        The bench gives the same prompt, budget, stop rule and post-processing to its peers.
        Raises PositionError for a position outside the document.
        """
        clock = clock or StageClock()
        request = _readable(request)
        language = request.language_id
        others = self._other_documents(request.uri)
        prompt = self.build_prompt(request, others)
        limit = max_new_tokens or self.config.max_new_tokens_for(language)
        context = CursorContext.parse(prompt.prefix, prompt.suffix, language)
        mode = decide_mode(context, self.config.language(language).multiline)
        clock.lap("context_ms")
        tokens = self.prompts.tokenize(prompt, heal=prompt.layout != "classic")
        anchored = self.anchored_draft(request, others, tokens.healed)
        clock.lap("tokenize_ms")
        return PreparedCompletion(
            request=request,
            prompt=prompt,
            prompt_ids=tokens.ids,
            before_cursor=tokens.before_cursor,
            after_cursor=tokens.after_cursor,
            anchored_draft=anchored,
            mode=mode,
            max_new_tokens=limit,
            tokenizer=self.tokenizer,
            context=context,
            healed=tokens.healed,
        )

    def warm(
        self,
        request: CompletionRequest,
        cancel: threading.Event | None = None,
        *,
        file_level: bool = False,
    ) -> int:
        """Extend the document's caches toward the prompt a request at this cursor would send,
        before that request arrives. Returns the tokens computed; stops when `cancel` is set.

        `file_level`: the cursor is not known (the request's position is not used); compute
        only the part of the prompt no cursor changes (the workspace head and the file's own
        header, up to its first text), as a request at the end of the file sees it: every
        request that does not show the file from its first line starts with it."""
        if self.should_complete(request) is not None:
            return 0
        request = _readable(request)
        if file_level:
            lines, _ = split_lines(request.text)
            line, character = len(lines) - 1, len(lines[-1])
            request = dataclasses.replace(
                request, line=line, character=character, offset=len(request.text)
            )
        self.refresh_documents(current=request)
        prepared = self.prepare(request)
        if file_level:
            leading = self.file_level_tokens(prepared.prompt)
            if leading is None or leading < 1:
                return 0
            # The backend computes all but the last token it is given (that one is a
            # request's first decode input): hand it one more than the file-level part.
            prepared = dataclasses.replace(prepared, prompt_ids=prepared.prompt_ids[: leading + 1])
        return self.backend.warm(prepared, cancel)

    def file_level_tokens(self, prompt: Prompt) -> int | None:
        """How many of `prompt`'s first tokens depend on no cursor: those of its parts before
        the current file's text (the head and the file's header). None when the format's parts
        do not tokenize apart (then the boundary is unknown)."""
        if not self.prompts.parts_ok:
            return None
        leading = 0
        ends = (self.template.fim_suffix, self.template.fim_middle)
        for part in prompt.parts:
            if part.role in ("prefix", "suffix", "middle") or part.text in ends:
                break  # the file's text, or the hole's markers (an empty prefix has no part)
            leading += len(self.prompts.cache.ids(part.text))
        return leading

    def complete(
        self,
        request: CompletionRequest,
        *,
        cancel: threading.Event | None = None,
        strategy: str | None = None,
        max_new_tokens: int | None = None,
    ) -> Completion:
        started = time.perf_counter()
        skipped = self.should_complete(request)
        if skipped is not None:
            return Completion(text="", skipped=skipped)
        clock = StageClock()
        request = _readable(request)
        prepared = self.prepare(request, max_new_tokens=max_new_tokens, clock=clock)
        self.refresh_documents(current=request)
        clock.lap("index_ms")
        generated = generate_step(
            lambda deadline: self.backend.generate(
                prepared, strategy=strategy, cancel=cancel, deadline=deadline
            ),
            self.config.decoding,
            clock,
        )
        if generated.stop_reason == "unsure":  # held back: nothing to show or fork
            self._answered.pop(request.slot or request.uri, None)
            clock.lap("postprocess_ms")
            stages = stages_of(clock, generated.stats)
            unsure = _completion(prepared, generated, Finished(""), (0, None), started, stages)
            unsure.confidence = confidence(generated.choices)
            return unsure
        shown = finish(generated.raw_text, prepared.context, prepared.mode)
        spans = scored_spans(prepared, generated.tokens, shown.text)
        self._answered[request.slot or request.uri] = _Answered(
            prepared, generated, shown.text, spans[0]
        )
        clock.lap("postprocess_ms")
        stages = stages_of(clock, generated.stats)
        return _completion(prepared, generated, shown, spans, started, stages)

    def has_answered(self, request: CompletionRequest) -> bool:
        """Whether the model's last answer on `request`'s cache slot was for its place."""
        answered = self._answered.get(request.slot or request.uri)
        return answered is not None and answered.serves(_readable(request))

    def alternatives(
        self,
        request: CompletionRequest,
        count: int,
        *,
        cancel: threading.Event | None = None,
    ) -> list[Completion]:
        """Up to `count` other suggestions for `request`, after `complete` answered it (the
        last answer for its document, the same text and cursor): forks of that answer where
        the model was least sure, post-processed like it. Suggestions that read like the answer
        or one before them, or that only repeat what the document has, are dropped, so fewer
        may come back (post-processing cuts a repeat of the text after the cursor off each, as
        off the answer). [] when the document's last answer was for another place."""
        if not self.has_answered(request) or count < 1:
            return []
        answered = self._answered[request.slot or request.uri]
        started = time.perf_counter()
        prepared = answered.prepared
        forks = self.backend.alternatives(
            prepared, answered.generated, count, within=answered.within, cancel=cancel
        )
        seen = {answered.shown}
        found: list[Completion] = []
        for generated in forks:
            shown = finish(generated.raw_text, prepared.context, prepared.mode)
            if not shown.text.strip() or shown.text in seen:
                continue
            seen.add(shown.text)
            spans = scored_spans(prepared, generated.tokens, shown.text)
            # latency: since the alternatives were asked for
            found.append(_completion(prepared, generated, shown, spans, started))
        found.sort(key=lambda c: -(c.confidence or 0.0))
        return found
