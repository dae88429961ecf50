"""`LocalBackend`: the pipeline's generation on this machine, by `decoding.Engine`.

It owns what only a local engine has: the target and draft models' KV caches per document,
the n-gram index the open documents feed (`document_index`), and the step costs measured once
per machine (`calibrate`). A pipeline hands it a prepared request (generation.py) and gets the
tokens back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from quickdraft.config import QuickdraftConfig
from quickdraft.context import OpenDocument, get_fim_template
from quickdraft.context.prompt import fit_prompt_budget
from quickdraft.decoding import CostModel, Engine, GenerationRequest, GenerationResult, NgramIndex
from quickdraft.decoding.costmodel import CALIBRATION_FORMAT, MEASURED_SIZES
from quickdraft.decoding.healing import TokenBytes
from quickdraft.decoding.runner import StaticModelRunner
from quickdraft.document_index import DocumentIndex
from quickdraft.generation import (
    CompletionRequest,
    Generated,
    PreparedCompletion,
    PreparedEdit,
    cursor_offset,
)
from quickdraft.machine import cpu_model
from quickdraft.models.loading import LoadedModels, Progress
from quickdraft.models.store import quickdraft_home, write_json_atomic
from quickdraft.text import unusable_reason
from quickdraft.tokens import PromptTokenizer

log = logging.getLogger(__name__)


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
    int8 = getattr(model, "_quickdraft_int8", None)  # its kernels (quantize.quantize_model)
    return f"{name}|{params.dtype}|{params.device}|{count}|{','.join(modules)}|{int8}"


class LocalBackend:
    def __init__(self, models: LoadedModels, config: QuickdraftConfig | None = None) -> None:
        config = config or QuickdraftConfig()
        self.models = models
        self.config = config
        self.prompts = PromptTokenizer(models.tokenizer, get_fim_template(models.family))
        compiled = config.model.compile == "on" or (
            config.model.compile == "auto" and str(models.device).startswith("cuda")
        )
        self.engine = Engine(
            models.target,
            models.draft,
            stop_token_ids=models.stop_token_ids,
            config=config.decoding,
            static_cache_tokens=config.model.static_cache_tokens if compiled else None,
            compile_steps=compiled,
            cache_bytes=config.cache.memory_mb << 20,
        )
        self.engine.token_bytes = TokenBytes(
            self.prompts.token_bytes(), self.engine.target.vocab_size
        )
        self.index = DocumentIndex(self.engine.ngram, self.prompts.cache.ids)
        # uri -> (text, cursor offset or None) as last indexed for n-gram drafting
        self._indexed: dict[str, tuple[str, int | None]] = {}

    # --- settings and step costs --------------------------------------------------------

    def configure(self, config: QuickdraftConfig) -> QuickdraftConfig:
        costs = self.engine.cost_model
        speed = costs.prefill_tokens_per_s if costs.measured else None
        fitted = fit_prompt_budget(config, speed)
        budget = fitted.context.max_prompt_tokens
        if fitted is not config and budget != self.config.context.max_prompt_tokens:
            log.info(
                "prompt budget %s tokens (context.max_prompt_tokens: auto; %s)",
                budget,
                f"the target prefills {speed:.0f} tokens/s here" if speed else "speed not measured",
            )
        config = fitted
        old = self.config.decoding
        self.config = config
        self.engine.config = config.decoding
        if (old.ngram_min, old.ngram_max) != (config.decoding.ngram_min, config.decoding.ngram_max):
            self.engine.ngram = NgramIndex(config.decoding.ngram_min, config.decoding.ngram_max)
            self.index = DocumentIndex(self.engine.ngram, self.prompts.cache.ids)
            self._indexed.clear()
        return config

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
            ",".join(map(str, MEASURED_SIZES)),  # sizes added since: measure again
            str(CALIBRATION_FORMAT),
            str(torch.get_num_threads()),
            torch.__version__,
            platform.machine(),
            cpu_model(),
            str(os.cpu_count()),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]

    # --- documents ----------------------------------------------------------------------

    def index_documents(
        self, documents: Mapping[str, OpenDocument], current: CompletionRequest | None
    ) -> None:
        """Index what changed since the last call (document_index: only changed chunks, only
        a window of each document). The document being
        completed in (`current`) is indexed split at the cursor, so the text before the
        cursor cannot match itself."""
        max_bytes = self.config.context.max_document_bytes
        for uri, doc in documents.items():
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

    def forget_document(self, uri: str) -> None:
        """A closed document is no longer a source of drafts."""
        self._indexed.pop(uri, None)
        self.index.remove(uri)

    # --- generation ---------------------------------------------------------------------

    def generate(
        self,
        prepared: PreparedCompletion,
        *,
        strategy: str | None,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> Generated:
        result = self.engine.generate(
            self._completion_request(prepared, strategy, cancel, deadline)
        )
        return self._generated(prepared, result)

    def alternatives(
        self,
        prepared: PreparedCompletion,
        generated: Generated,
        count: int,
        *,
        within: int,
        cancel: threading.Event | None,
    ) -> list[Generated]:
        """Forks of the engine's answer (`Engine.alternatives`): its cache still holds it
        unless another request used the document's slot since, and then there are none."""
        request = self._completion_request(prepared, None, cancel, None)
        answer = GenerationResult(
            generated.tokens, generated.stop_reason, generated.stats, generated.choices
        )
        forks = self.engine.alternatives(request, answer, count, within=within)
        return [self._generated(prepared, fork) for fork in forks]

    def _completion_request(
        self,
        prepared: PreparedCompletion,
        strategy: str | None,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> GenerationRequest:
        return self._request(
            prepared,
            strategy,
            cancel,
            deadline,
            draft_length=self.draft_length_for(prepared.request.language_id),
            kind=prepared.mode,
            lookup_context=prepared.before_cursor,
            after_cursor=prepared.after_cursor,
            required_prefix=prepared.healed.encode("utf-8"),
            anchored_draft=prepared.anchored_draft,
            slot=prepared.request.slot or prepared.request.uri,
            abstain_below=prepared.request.min_confidence,
        )

    def _generated(self, prepared: PreparedCompletion, result: GenerationResult) -> Generated:
        raw = prepared.inserted(
            self.models.tokenizer.decode(result.tokens, skip_special_tokens=True)
        )
        return Generated(raw or "", result.tokens, result.stop_reason, result.stats, result.choices)

    def generate_edit(
        self,
        prepared: PreparedEdit,
        *,
        strategy: str | None,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> Generated:
        """A next edit's rewrite: the region as it stands is the copy source the n-gram
        strategies draft from (long drafts, realigned after the output departs from it), in
        a cache slot of its own (the document's completion cache stays as it is)."""
        request = self._request(
            prepared,
            strategy,
            cancel,
            deadline,
            kind="edit",
            copy_source=prepared.copy_source,
            max_copy_draft=self.config.edits.max_draft_length,
            slot=prepared.slot,
        )
        result = self.engine.generate(request)
        text = self.models.tokenizer.decode(result.tokens, skip_special_tokens=True)
        return Generated(text, result.tokens, result.stop_reason, result.stats)

    def _request(
        self,
        prepared: PreparedCompletion | PreparedEdit,
        strategy: str | None,
        cancel: threading.Event | None,
        deadline: float | None,
        **fields: Any,
    ) -> GenerationRequest:
        """One generation's request with the decoding settings, `prepared`'s prompt, budget and stop
        rule, and what the kind of request adds (`fields`: GenerationRequest's own names)."""
        decoding = self.config.decoding
        return GenerationRequest(
            prompt_ids=prepared.prompt_ids,
            max_new_tokens=prepared.max_new_tokens,
            strategy=strategy or decoding.strategy,
            temperature=decoding.temperature,
            top_p=decoding.top_p,
            seed=decoding.seed,
            language=prepared.request.language_id,
            deadline=deadline,
            cancel=cancel,
            stop=prepared.stop_rule(),
            **fields,
        )

    def draft_length_for(self, language_id: str | None) -> int | None:
        """The fixed draft length for a language: the user's setting for that language, else
        their global one, else the preset's measured default; None lets the cost model choose."""
        configured = self.config.draft_length_for(language_id)
        if configured is not None:
            return configured
        preset = self.models.preset
        lengths = preset.draft_lengths if preset is not None else {}
        return lengths.get(language_id or "")

    @property
    def engine_status(self) -> None:
        return None  # no engine but this machine's

    @property
    def works_ahead(self) -> bool:
        return True  # the KV caches and the n-gram index are this machine's

    def warm(self, prepared: PreparedCompletion, cancel: threading.Event | None) -> int:
        """Extend the document's KV caches toward `prepared`'s prompt (the draft model's too
        when the policy would draft with it)."""
        request = prepared.request
        wanted = prepared.prompt_ids[:-1]
        self.engine.select_slot(request.uri)
        held = self.engine.target.tokens
        if len(held) >= len(wanted) and held[: len(wanted)] == list(wanted):
            # Already computed, and maybe more after it (a request's whole prompt, where the
            # warm-up asks only for the file-level part): a warm-up never crops a cache.
            return 0
        return self.engine.warm(
            prepared.prompt_ids,
            slot=request.uri,
            draft=self.engine.drafts_with_model(request.language_id, self.config.decoding.strategy),
            cancel=cancel,
        ).computed

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
        """`model`'s log-probabilities of the continuations (`Engine.likelihoods`)."""
        return self.engine.likelihoods(
            prompt_ids, continuations, slot=slot, model=model, cancel=cancel, deadline=deadline
        )

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
        """Greedy text after a fill-in-the-middle prompt, with the configured strategy (the
        same tokens as plain decoding), in `slot`'s cache (`Backend.fill`)."""
        decode = self.models.tokenizer.decode
        result = self.engine.generate(
            GenerationRequest(
                prompt_ids=list(prompt_ids),
                max_new_tokens=max_new_tokens,
                strategy=self.config.decoding.strategy,
                language=language_id,
                kind="fill",
                cancel=cancel,
                stop=lambda tokens: ended(decode(tokens, skip_special_tokens=True)),
                slot=slot,
            )
        )
        if result.stop_reason == "cancelled":
            return None
        text = decode(result.tokens, skip_special_tokens=True)
        return Generated(text, result.tokens, result.stop_reason, result.stats, result.choices)

    def prefill(
        self, prompt_ids: Sequence[int], *, slot: str, model: str, cancel: threading.Event | None
    ) -> int:
        """`model`'s cache of a prompt's head, ahead of `likelihoods` (`Engine.prefill`)."""
        return self.engine.prefill(prompt_ids, slot=slot, model=model, cancel=cancel)

    def reset_cache(self) -> None:
        """A cold start: no KV cache, and no memory of text generated earlier (the n-gram
        drafter's recent completions, the runner-up tokens kept for trees)."""
        self.engine.reset_cache()
        self.engine.forget_generated()

    # --- how it computes ----------------------------------------------------------------

    @property
    def compute_path(self) -> str | None:
        """What the engine computes with, as identity is reported per path: runtime, dtype
        (with the int8 kernel), device, KV cache."""
        models, target = self.models, self.engine.target
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
        target = self.engine.target
        return bool(getattr(target, "_prefill_kwargs", None)) and self.models.dtype == "int8"

    @property
    def compute(self) -> dict[str, Any]:
        models = self.models
        kernel = models.kernel
        return {
            "runtime": models.runtime,
            "dtype": models.dtype,
            "kernel": kernel.label if kernel is not None else None,
            "reason": kernel.reason if kernel is not None else models.runtime_reason,
            "runtimeReason": models.runtime_reason,
        }

    def close(self) -> None:
        """Release what the models hold outside Python's memory (llama.cpp's contexts and
        weights)."""
        self.engine.close()  # contexts first: they point into the models' weights
        for model in (self.models.target, self.models.draft):
            close = getattr(model, "close", None)  # LlamaCppModel; torch modules have none
            if callable(close):
                close()
