"""The completion pipeline shared by `quickdraft complete`, `quickdraft serve` and the bench:

    document -> should_complete -> build_prompt -> tokenize (token healing) -> generate
             (stop rule inside) -> finalize

It owns the engine and the open documents (which feed the n-gram drafter), and knows nothing
about LSP: positions are 0-based lines and Python string offsets.

Threads: a Completer belongs to one thread (the language server's model worker; the CLI's and
the bench's main thread). Nothing in it is locked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from quickdraft.config import QuickdraftConfig
from quickdraft.context import OpenDocument, Prompt, build_prompt, get_fim_template
from quickdraft.context.continuation import find_continuation
from quickdraft.context.prompt import TokenCounter
from quickdraft.context.snippets import uri_to_path
from quickdraft.decoding import CostModel, Engine, GenerationRequest, GenerationStats
from quickdraft.decoding.healing import TokenBytes
from quickdraft.document_index import DocumentIndex
from quickdraft.errors import InputError
from quickdraft.machine import cpu_model
from quickdraft.models.loading import LoadedModels, Progress

if TYPE_CHECKING:
    from quickdraft.remote.models import RemoteModels
from quickdraft.models.store import quickdraft_home, write_json_atomic
from quickdraft.postprocess import CursorContext, StopRule, decide_mode, finalize
from quickdraft.text import unusable_reason, without_lone_surrogates
from quickdraft.tokens import PromptTokenizer

log = logging.getLogger(__name__)


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
    prompt_tokens: int = 0
    latency_ms: float = 0.0
    skipped: str | None = None
    """Why no completion was attempted (language disabled, document too large, binary)."""


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


ANCHORED_DRAFT_TOKENS = 64
"""The most tokens of an open document's text proposed from the cursor on."""
CONTINUATION_WINDOW = 4096
"""How much of the text before the cursor the continuation lookup matches on (it needs its
last few hundred characters)."""


def cursor_offset(request: CompletionRequest) -> int:
    """The request's cursor as an index into its text (reads the text up to the cursor's line
    when the caller did not say)."""
    if request.offset is not None:
        return request.offset
    from quickdraft.context.prompt import _offset_by_splitting

    return _offset_by_splitting(request.text, request.line, request.character)


def _readable(request: CompletionRequest) -> CompletionRequest:
    """The request with lone surrogates in its text replaced (offsets unchanged): a tokenizer
    cannot encode them, and one odd character must not cost the whole completion."""
    clean = without_lone_surrogates(request.text)
    return request if clean is request.text else dataclasses.replace(request, text=clean)


def model_fingerprint(model: Any) -> str:
    """What identifies a loaded model's speed: its files, precision, device and modules."""
    if model is None:
        return "none"
    describe = getattr(model, "describe", None)
    if callable(describe):  # llama.cpp
        info = describe()
        return f"{info.get('path')}|{info.get('file_bytes')}|{info.get('extra_buffers')}"
    params = next(model.parameters())
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    modules = sorted({type(m).__name__ for m in model.modules()})
    count = sum(p.numel() for p in model.parameters())
    return f"{name}|{params.dtype}|{params.device}|{count}|{','.join(modules)}"


class Completer:
    def __init__(
        self, models: LoadedModels | RemoteModels, config: QuickdraftConfig | None = None
    ) -> None:
        self.models = models
        self.config = config or QuickdraftConfig()
        self.tokenizer = models.tokenizer
        self.template = get_fim_template(models.family)
        self.prompts = PromptTokenizer(self.tokenizer, self.template)
        """Prompts into tokens, part by part, each part's tokens remembered."""
        self.count_tokens = TokenCounter(self.prompts.cache.count)
        self.engine = self._create_engine()
        self.documents: OrderedDict[str, OpenDocument] = OrderedDict()
        """Open documents, least recently changed first (their order in the prompt)."""
        self.index = (
            DocumentIndex(self.engine.ngram, self.prompts.cache.ids)
            if self.engine is not None
            else None
        )
        # uri -> (text, cursor offset or None) as last indexed for n-gram drafting
        self._indexed: dict[str, tuple[str, int | None]] = {}
        self.root: str | None = None
        """The workspace folder prompts show paths relative to (the language server sets it)."""

    def _create_engine(self) -> Engine | None:
        """The local decoding engine over `self.models` (`remote.RemoteCompleter`: None)."""
        models = self.models
        compiled = self.config.model.compile == "on" or (
            self.config.model.compile == "auto" and str(models.device).startswith("cuda")
        )
        engine = Engine(
            models.target,
            models.draft,
            stop_token_ids=models.stop_token_ids,
            config=self.config.decoding,
            static_cache_tokens=self.config.model.static_cache_tokens if compiled else None,
            compile_steps=compiled,
            cache_bytes=self.config.cache.memory_mb << 20,
        )
        engine.token_bytes = TokenBytes(self.prompts.token_bytes(), engine.target.vocab_size)
        return engine

    @classmethod
    def load(cls, config: QuickdraftConfig, *, progress: Progress | None = None) -> Completer:
        """Load the configured models, then measure step costs (cached per machine) when the
        strategy can draft; every step is told to `progress`. With `model.backend: openai`, a
        serving engine generates instead (`quickdraft.remote`: tokenizer files only)."""
        if config.model.backend == "openai":
            from quickdraft.remote import RemoteCompleter

            return RemoteCompleter.from_config(config, progress=progress)
        from quickdraft.models import load_models

        loaded = load_models(config.model, progress=progress)
        completer = cls(loaded, config)
        if config.model.calibrate and config.decoding.strategy != "ar":
            completer.calibrate(progress=progress)
        return completer

    @property
    def compute_path(self) -> str | None:
        """What the engine computes with, as identity is reported per path: runtime, dtype
        (with the int8 kernel), device, KV cache. None without a local engine (remote)."""
        from quickdraft.decoding.runner import StaticModelRunner

        models, target = self.models, getattr(self.engine, "target", None)
        if target is None:
            return None
        if models.runtime == "llamacpp":
            how = "llama.cpp"
        else:
            backend = getattr(models.target, "_quickdraft_int8", {}).get("backend")
            how = f"torch {models.dtype}" + (f"/{backend}" if backend else "")
        cache = "growing KV cache"
        if isinstance(target, StaticModelRunner):
            cache = "static KV cache" + (", compiled steps" if target.compiled else "")
        return f"{how}, {models.device}, {cache}"

    @property
    def batch_invariant(self) -> bool:
        """Whether a k-token verify forward gives bitwise the logits of k one-token steps, and a
        warm prefill those of a cold one: then every greedy strategy is token-identical to
        `ar` by construction. True for torch's int8 (integer matmuls, row-wise attention);
        elsewhere identity is a measured rate (docs/performance.md)."""
        target = getattr(self.engine, "target", None)
        return bool(getattr(target, "_prefill_kwargs", None)) and self.models.dtype == "int8"

    @property
    def compute(self) -> dict[str, Any]:
        """How the models run here and why (for `$/quickdraft/stats` and the log)."""
        models = self.models
        kernel = models.kernel
        return {
            "runtime": models.runtime,
            "dtype": models.dtype,
            "kernel": kernel.label if kernel is not None else None,
            "reason": kernel.reason if kernel is not None else models.runtime_reason,
            "runtimeReason": models.runtime_reason,
        }

    def describe(self) -> str:
        """One line for logs and status items: the models and how they run."""
        return self.models.summary()

    def close(self) -> None:
        """Release what the models hold outside Python's memory (llama.cpp's contexts and
        weights); the Completer is not used afterwards."""
        if self.engine is not None:
            self.engine.close()  # contexts first: they point into the models' weights
        for model in (self.models.target, self.models.draft):
            close = getattr(model, "close", None)  # LlamaCppModel; torch modules have none
            if callable(close):
                close()

    # --- configuration and calibration ---------------------------------------------------

    def update_config(self, config: QuickdraftConfig) -> None:
        """Apply new settings; model settings are the loader's business, not this one's."""
        old = self.config.decoding
        self.config = config
        self.engine.config = config.decoding
        if (old.ngram_min, old.ngram_max) != (config.decoding.ngram_min, config.decoding.ngram_max):
            from quickdraft.decoding import NgramIndex

            self.engine.ngram = NgramIndex(config.decoding.ngram_min, config.decoding.ngram_max)
            self.index = DocumentIndex(self.engine.ngram, self.prompts.cache.ids)
            self._indexed.clear()

    def calibrate(
        self,
        context_tokens: int = 256,
        cache: bool = True,
        budget_s: float = 15.0,
        progress: Progress | None = None,
    ) -> CostModel:
        """Measure step costs once per machine and model (at most `budget_s`), then reuse
        them from disk. Figures taken on a busy machine serve this run only."""
        key = self._calibration_key(context_tokens)
        path = quickdraft_home() / "calibration" / f"{key}.json"
        if cache and path.exists():
            try:
                costs = CostModel.from_dict(json.loads(path.read_text()))
                self.engine.cost_model = costs
                return costs
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable calibration file %s", path)
        if progress is not None:
            progress(f"measuring step costs (once per machine; at most {budget_s:.0f} s)")
        costs = self.engine.calibrate(context_tokens=context_tokens, budget_s=budget_s)
        if costs.busy:
            log.warning(
                "step costs measured while other processes kept the CPU busy: used for this "
                "run only, measured again at the next start"
            )
        elif cache:
            write_json_atomic(path, costs.to_dict())
        return costs

    def _calibration_key(self, context_tokens: int) -> str:
        parts = [
            model_fingerprint(self.models.target),
            model_fingerprint(self.models.draft),
            str(context_tokens),
            str(torch.get_num_threads()),
            torch.__version__,
            platform.machine(),
            cpu_model(),
            str(os.cpu_count()),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]

    def draft_length_for(self, language_id: str | None) -> int | None:
        """The fixed draft length for a language: the user's setting for that language, else
        their global one, else the preset's measured default; None lets the cost model choose."""
        configured = self.config.draft_length_for(language_id)
        if configured is not None:
            return configured
        preset = self.models.preset
        lengths = preset.draft_lengths if preset is not None else {}
        return lengths.get(language_id or "")

    # --- documents -------------------------------------------------------------------------

    def set_document(self, uri: str, text: str, language_id: str | None = None) -> None:
        """Open or change a document. Its tokens reach the n-gram index at the next request;
        a changed document moves to the end of the prompt's other files."""
        text = without_lone_surrogates(text)
        known = self.documents.get(uri)
        if known is not None and known.text == text and known.language_id == language_id:
            return
        self.documents[uri] = OpenDocument(
            path=uri_to_path(uri), text=text, language_id=language_id
        )
        self.documents.move_to_end(uri)

    def close_document(self, uri: str) -> None:
        self.documents.pop(uri, None)
        self._indexed.pop(uri, None)
        if self.index is not None:
            self.index.remove(uri)

    def refresh_documents(self, current: CompletionRequest | None = None) -> None:
        """Index what changed since the last request for n-gram drafting (document_index:
        only changed chunks, only a window of each document). The document being completed
        in (`current`) is indexed split at the cursor."""
        if self.index is None:
            return
        max_bytes = self.config.context.max_document_bytes
        for uri, doc in self.documents.items():
            if current is not None and uri == current.uri:
                continue
            indexed = self._indexed.get(uri)
            if indexed is not None and indexed[1] is None and indexed[0] is doc.text:
                continue
            if unusable_reason(doc.text, max_bytes) is None:
                self.index.update(uri, doc.text)
            else:
                self.index.remove(uri)  # too large or binary: no source of drafts
            self._indexed[uri] = (doc.text, None)
        if current is not None and unusable_reason(current.text, max_bytes) is None:
            offset = cursor_offset(current)
            if self._indexed.get(current.uri) != (current.text, offset):
                self.index.update(current.uri, current.text, offset)
                self._indexed[current.uri] = (current.text, offset)

    # --- work ahead of the user ---------------------------------------------------------

    def warm(self, request: CompletionRequest, cancel: threading.Event | None = None) -> int:
        """Extend the document's KV caches toward the prompt a request at this cursor would
        send (the draft model's too when the policy would draft with it), before that request
        arrives. Returns the target tokens computed; stops when `cancel` is set."""
        if self.engine is None or self.should_complete(request) is not None:
            return 0
        request = _readable(request)
        self.refresh_documents(current=request)
        prepared = self.prepare(request)
        strategy = self.config.decoding.strategy
        computed, _ = self.engine.warm(
            prepared.prompt_ids,
            slot=request.uri,
            draft=self.engine.drafts_with_model(request.language_id, strategy),
            cancel=cancel,
        )
        return computed

    # --- the pipeline ----------------------------------------------------------------------

    def should_complete(self, request: CompletionRequest) -> str | None:
        """None if the request should be answered by the model, else the reason not to."""
        if not self.config.language(request.language_id).enabled:
            return f"completion disabled for {request.language_id}"
        return unusable_reason(request.text, self.config.context.max_document_bytes)

    def build_prompt(self, request: CompletionRequest) -> Prompt:
        max_bytes = self.config.context.max_document_bytes
        others = [
            doc
            for uri, doc in self.documents.items()
            if uri != request.uri and unusable_reason(doc.text, max_bytes) is None
        ]
        return build_prompt(
            request.text,
            request.line,
            request.character,
            request.language_id,
            others,
            self.template,
            self.count_tokens,
            self.config.context,
            path=uri_to_path(request.uri),
            offset=request.offset,
            root=self.root,
        )

    def anchored_draft(self, request: CompletionRequest, healed: str = "") -> list[int] | None:
        """What followed the text before the cursor elsewhere (context.continuation), as the
        tokens the model would write for it, starting with the `healed` characters the
        completion must write first; None when there is nothing to propose."""
        offset = cursor_offset(request)
        max_bytes = self.config.context.max_document_bytes
        others = [
            (uri, doc.text, None)
            for uri, doc in self.documents.items()
            if uri != request.uri and unusable_reason(doc.text, max_bytes) is None
        ]
        window_start = max(0, offset - CONTINUATION_WINDOW)
        found = find_continuation(
            request.text[window_start:offset],
            [(request.uri, request.text, offset), *others],
        )
        if found is None and not healed:
            return None
        text = healed + (found.text if found is not None else "")
        return list(self.prompts.cache.ids(text))[:ANCHORED_DRAFT_TOKENS] or None

    def prepare(
        self, request: CompletionRequest, *, max_new_tokens: int | None = None
    ) -> PreparedCompletion:
        """Everything `complete` hands the engine and applies after it, without generating.

        The bench gives the same prompt, budget, stop rule and post-processing to its peers.
        Raises PositionError for a position outside the document.
        """
        request = _readable(request)
        prompt = self.build_prompt(request)
        heal = prompt.layout == "append"
        tokens = self.prompts.tokenize(prompt, heal=heal)
        language = request.language_id
        limit = max_new_tokens or self.config.max_new_tokens_for(language)
        if limit < 1:
            raise InputError(f"max new tokens must be at least 1, got {limit}")
        context = CursorContext.parse(prompt.prefix, prompt.suffix, language)
        mode = decide_mode(context, self.config.language(language).multiline)
        return PreparedCompletion(
            request=request,
            prompt=prompt,
            prompt_ids=tokens.ids,
            before_cursor=tokens.before_cursor,
            after_cursor=tokens.after_cursor,
            anchored_draft=self.anchored_draft(request, tokens.healed)
            if self.engine is not None
            else None,
            mode=mode,
            max_new_tokens=limit,
            tokenizer=self.tokenizer,
            context=context,
            healed=tokens.healed,
        )

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
        request = _readable(request)
        prepared = self.prepare(request, max_new_tokens=max_new_tokens)
        self.refresh_documents(current=request)
        decoding = self.config.decoding
        deadline = time.monotonic() + decoding.deadline_ms / 1000 if decoding.deadline_ms else None
        completion = self._generate(prepared, cancel=cancel, strategy=strategy, deadline=deadline)
        completion.latency_ms = (time.perf_counter() - started) * 1000
        return completion

    def _generate(
        self,
        prepared: PreparedCompletion,
        *,
        cancel: threading.Event | None,
        strategy: str | None,
        deadline: float | None,
    ) -> Completion:
        """Generate for a prepared request and post-process (the remote Completer's differs)."""
        decoding = self.config.decoding
        language = prepared.request.language_id
        result = self.engine.generate(
            GenerationRequest(
                prompt_ids=prepared.prompt_ids,
                max_new_tokens=prepared.max_new_tokens,
                strategy=strategy or decoding.strategy,
                temperature=decoding.temperature,
                top_p=decoding.top_p,
                seed=decoding.seed,
                draft_length=self.draft_length_for(language),
                language=language,
                kind=prepared.mode,
                lookup_context=prepared.before_cursor,
                after_cursor=prepared.after_cursor,
                required_prefix=prepared.healed.encode("utf-8"),
                anchored_draft=prepared.anchored_draft,
                deadline=deadline,
                cancel=cancel,
                stop=prepared.stop_rule(),
                slot=prepared.request.slot or prepared.request.uri,
            )
        )
        raw, text = prepared.finish(result.tokens)
        return Completion(
            text=text,
            tokens=result.tokens,
            raw_text=raw,
            mode=prepared.mode,
            stop_reason=result.stop_reason,
            stats=result.stats,
            prompt_tokens=len(prepared.prompt_ids),
        )
