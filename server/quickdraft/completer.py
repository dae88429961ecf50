"""The completion pipeline shared by `quickdraft complete`, `quickdraft serve` and the bench:

    document -> should_complete -> build_prompt -> generate (stop rule inside) -> finalize

It owns the engine and the open documents (which feed the n-gram drafter), and knows nothing
about LSP: positions are 0-based lines and Python string offsets.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from quickdraft.config import QuickdraftConfig
from quickdraft.context import OpenDocument, Prompt, build_prompt, get_fim_template
from quickdraft.context.continuation import find_continuation
from quickdraft.context.prompt import split_lines
from quickdraft.context.snippets import uri_to_path
from quickdraft.decoding import CostModel, Engine, GenerationRequest, GenerationStats
from quickdraft.errors import InputError
from quickdraft.models.loading import LoadedModels, Progress

if TYPE_CHECKING:
    from quickdraft.remote.models import RemoteModels
from quickdraft.models.store import quickdraft_home
from quickdraft.postprocess import StopRule, decide_mode, finalize

log = logging.getLogger(__name__)


@dataclass
class CompletionRequest:
    uri: str
    text: str
    line: int
    character: int
    language_id: str | None = None


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
    cursor: int | None
    """How many of `prompt_ids` stand before the cursor (see GenerationRequest.cursor)."""
    anchored_draft: list[int] | None
    """What followed the text before the cursor in an open document, as tokens."""
    mode: str
    """"line" or "block" (postprocess.decide_mode)."""
    max_new_tokens: int
    tokenizer: Any

    def text_stop_rule(self) -> StopRule:
        """A fresh stop rule for one generation: text so far -> complete now?"""
        return StopRule(self.prompt.prefix, self.prompt.suffix, self.request.language_id, self.mode)

    def stop_rule(self) -> Callable[[list[int]], bool]:
        """A fresh stop callback for one generation: new tokens so far -> complete now?"""
        rule = self.text_stop_rule()
        return lambda tokens: rule(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def finish(self, tokens: list[int]) -> tuple[str, str]:
        """(raw decoded text, the text to insert after post-processing)."""
        return self.finish_text(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def finish_text(self, raw: str) -> tuple[str, str]:
        """(raw text, the text to insert after post-processing)."""
        return raw, finalize(
            raw, self.prompt.prefix, self.prompt.suffix, self.request.language_id, self.mode
        )


ANCHORED_DRAFT_TOKENS = 64
"""The most tokens of an open document's text proposed from the cursor on."""


def after_cursor_source(uri: str) -> str:
    """The n-gram source name for the text after the cursor in the document at `uri`."""
    return f"{uri}#after-cursor"


def cursor_offset(text: str, line: int, character: int) -> int:
    """(line, character) in code points as an index into `text` (position already checked)."""
    contents, endings = split_lines(text)
    return sum(len(c) + len(e) for c, e in zip(contents[:line], endings[:line], strict=True)) + (
        character
    )


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
        self.engine = self._create_engine()
        self.documents: dict[str, OpenDocument] = {}
        # uri -> (text, cursor offset or None) as last indexed for n-gram drafting
        self._indexed: dict[str, tuple[str, int | None]] = {}
        self._lock = threading.Lock()

    def _create_engine(self) -> Engine | None:
        """The local decoding engine over `self.models` (`remote.RemoteCompleter`: None)."""
        models = self.models
        compiled = self.config.model.compile == "on" or (
            self.config.model.compile == "auto" and str(models.device).startswith("cuda")
        )
        return Engine(
            models.target,
            models.draft,
            stop_token_ids=models.stop_token_ids,
            config=self.config.decoding,
            static_cache_tokens=self.config.model.static_cache_tokens if compiled else None,
            compile_steps=compiled,
        )

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
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(costs.to_dict(), indent=2))
            tmp.replace(path)
        return costs

    def _calibration_key(self, context_tokens: int) -> str:
        from quickdraft.models.cpu_kernels import cpu_model

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
        """Open or change a document. Its tokens reach the n-gram index at the next request."""
        with self._lock:
            self.documents[uri] = OpenDocument(
                path=uri_to_path(uri), text=text, language_id=language_id
            )

    def close_document(self, uri: str) -> None:
        with self._lock:
            self.documents.pop(uri, None)
            self._indexed.pop(uri, None)
        self.engine.ngram.remove_source(uri)
        self.engine.ngram.remove_source(after_cursor_source(uri))

    def refresh_documents(self, current: CompletionRequest | None = None) -> None:
        """Re-tokenize the documents that changed since the last request (only those).

        The document being completed in (`current`) is indexed as two sources split at the
        cursor: indexed whole, the text before the cursor would match itself and propose the
        text after the cursor, shadowing every real match.
        """
        wanted: dict[str, tuple[str, int | None]] = {}
        with self._lock:
            for uri, doc in self.documents.items():
                # Unchanged documents first: checking usability encodes the whole text.
                if self._indexed.get(uri) != (doc.text, None) and self._usable(doc.text) is None:
                    wanted[uri] = (doc.text, None)
        if current is not None and self._usable(current.text) is None:
            wanted[current.uri] = (
                current.text,
                cursor_offset(current.text, current.line, current.character),
            )
        ngram = self.engine.ngram
        for uri, (text, cursor) in wanted.items():
            if self._indexed.get(uri) == (text, cursor):
                continue
            if cursor is None:
                ngram.set_source(uri, self.tokenizer.encode(text, add_special_tokens=False))
                ngram.remove_source(after_cursor_source(uri))
            else:
                encode = self.tokenizer.encode
                ngram.set_source(uri, encode(text[:cursor], add_special_tokens=False))
                ngram.set_source(
                    after_cursor_source(uri), encode(text[cursor:], add_special_tokens=False)
                )
            self._indexed[uri] = (text, cursor)

    def _usable(self, text: str) -> str | None:
        """Why a document cannot be completed in, or None."""
        if len(text) > self.config.context.max_document_bytes or (
            len(text.encode("utf-8", "surrogatepass")) > self.config.context.max_document_bytes
        ):
            return f"document larger than {self.config.context.max_document_bytes} bytes"
        if "\x00" in text:
            return "binary document (contains NUL bytes)"
        return None

    # --- the pipeline ----------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def should_complete(self, request: CompletionRequest) -> str | None:
        """None if the request should be answered by the model, else the reason not to."""
        if not self.config.language(request.language_id).enabled:
            return f"completion disabled for {request.language_id}"
        return self._usable(request.text)

    def build_prompt(self, request: CompletionRequest) -> Prompt:
        others = [doc for uri, doc in self.documents.items() if uri != request.uri]
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
        )

    def anchored_draft(self, request: CompletionRequest) -> list[int] | None:
        """What followed the text before the cursor elsewhere (context.continuation), as the
        tokens the model would write for it; None when no open document has it."""
        offset = cursor_offset(request.text, request.line, request.character)
        with self._lock:
            others = [
                (uri, doc.text, None)
                for uri, doc in self.documents.items()
                if uri != request.uri and self._usable(doc.text) is None
            ]
        found = find_continuation(
            request.text[:offset], [(request.uri, request.text, offset), *others]
        )
        if found is None:
            return None
        tokens = self.tokenizer.encode(found.text, add_special_tokens=False)
        return tokens[:ANCHORED_DRAFT_TOKENS]

    def _cursor_token(self, prompt_text: str, prompt_ids: list[int]) -> int | None:
        """How many of `prompt_ids` come before the cursor: the prompt up to the FIM suffix
        marker. None when that part does not tokenize to a prefix of the prompt's tokens."""
        marker = prompt_text.rfind(self.template.fim_suffix)
        if marker < 0:
            return None
        head = self.tokenizer.encode(prompt_text[:marker], add_special_tokens=False)
        return len(head) if prompt_ids[: len(head)] == head else None

    def prepare(
        self, request: CompletionRequest, *, max_new_tokens: int | None = None
    ) -> PreparedCompletion:
        """Everything `complete` hands the engine and applies after it, without generating.

        The bench gives the same prompt, budget, stop rule and post-processing to its peers.
        Raises PositionError for a position outside the document.
        """
        prompt = self.build_prompt(request)
        prompt_ids = self.tokenizer.encode(prompt.text, add_special_tokens=False)
        language = request.language_id
        limit = max_new_tokens or self.config.max_new_tokens_for(language)
        if limit < 1:
            raise InputError(f"max new tokens must be at least 1, got {limit}")
        mode = decide_mode(
            prompt.prefix, prompt.suffix, language, self.config.language(language).multiline
        )
        return PreparedCompletion(
            request=request,
            prompt=prompt,
            prompt_ids=prompt_ids,
            cursor=self._cursor_token(prompt.text, prompt_ids),
            anchored_draft=self.anchored_draft(request),
            mode=mode,
            max_new_tokens=limit,
            tokenizer=self.tokenizer,
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
                cursor=prepared.cursor,
                anchored_draft=prepared.anchored_draft,
                deadline=deadline,
                cancel=cancel,
                stop=prepared.stop_rule(),
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
