"""`RemoteBackend`: the pipeline's generation at a serving engine, where the local engine was.

Everything up to the prompt is the pipeline's (documents, `build_prompt`, the token budget
counted with the family's tokenizer) and so is everything after (the stop rule, here run on the
streamed text, and `finalize`). As llm-ls gives each backend two plain functions, this one has
two jobs: send the prompt as the engine's body, and read its answer back as `Generated`. The
engine does its own decoding, batching and speculation, so nothing here keeps an n-gram index
or measures step costs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from quickdraft.config import QuickdraftConfig
from quickdraft.context import OpenDocument, get_fim_template
from quickdraft.context.prompt import fit_prompt_budget
from quickdraft.decoding import GenerationStats
from quickdraft.generation import CompletionRequest, Generated, PreparedCompletion, PreparedEdit
from quickdraft.remote.generator import RemoteGenerator
from quickdraft.remote.models import RemoteModels, load_remote_models
from quickdraft.remote.status import EngineStatus
from quickdraft.tokens import PromptTokenizer

STRATEGY = "remote"
"""The name completions from the engine carry in their stats."""


def classic_layout(config: QuickdraftConfig) -> QuickdraftConfig:
    """`config` with the classic prompt layout. The append layout's prompt ends inside the
    text before the cursor, and completes well only with token healing, which holds the first
    generated tokens to the characters taken off the prompt: an OpenAI-compatible engine cannot
    be held to them (after `return  ` the 0.5B wrote ` width`, which cannot follow), so the
    remote backend keeps the cursor at the FIM middle marker. Engines cache the prompt's shared
    head either way."""
    if config.context.layout == "classic":
        return config
    return replace(config, context=replace(config.context, layout="classic"))


class RemoteBackend:
    def __init__(
        self,
        models: RemoteModels,
        config: QuickdraftConfig,
        generator: RemoteGenerator | None = None,
    ) -> None:
        self.models = models
        self.config = classic_layout(config)
        self.prompts = PromptTokenizer(models.tokenizer, get_fim_template(models.family))
        self.generator = generator or RemoteGenerator.from_config(config.model, models.stop_tokens)
        models.engine = self.generator.describe()

    @property
    def engine_status(self) -> EngineStatus:
        """The engine's state ("ready", "unavailable", ...), which the server shows."""
        return self.generator.status

    def configure(self, config: QuickdraftConfig) -> QuickdraftConfig:
        # Model settings (URL, key, timeouts) come with a new backend; the engine's prefill
        # speed is not measured here, so an `auto` budget is the fixed one.
        self.config = classic_layout(fit_prompt_budget(config, None))
        return self.config

    def index_documents(
        self, documents: Mapping[str, OpenDocument], current: CompletionRequest | None
    ) -> None:
        """Nothing to index: the engine drafts from the prompt it is sent (vLLM's n-gram
        lookup, llama-server's lookup decoding)."""

    def forget_document(self, uri: str) -> None:
        """Nothing is kept of documents here."""

    def generate(
        self,
        prepared: PreparedCompletion,
        *,
        strategy: str | None,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> Generated:
        return self._generate_prepared(prepared, cancel, deadline)

    def generate_edit(
        self,
        prepared: PreparedEdit,
        *,
        strategy: str | None,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> Generated:
        """A next edit's prompt as a plain `/v1/completions` request (the engine drafts for
        itself), its stream closed once the region is written."""
        return self._generate_prepared(prepared, cancel, deadline)

    def _generate_prepared(
        self,
        prepared: PreparedCompletion | PreparedEdit,
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> Generated:
        """`prepared`'s prompt text, budget and text stop rule, sent to the engine."""
        return self._generate(
            prepared.prompt.text,
            prepared.max_new_tokens,
            len(prepared.prompt_ids),
            prepared.text_stop_rule(),
            cancel,
            deadline,
        )

    def _generate(
        self,
        prompt: str,
        max_tokens: int,
        prompt_tokens: int,
        should_stop: Callable[[str], bool],
        cancel: threading.Event | None,
        deadline: float | None,
    ) -> Generated:
        decoding = self.config.decoding
        result = self.generator.generate(
            prompt,
            max_tokens=max_tokens,
            temperature=decoding.temperature,
            top_p=decoding.top_p,
            seed=decoding.seed,
            should_stop=should_stop,
            cancel=cancel,
            deadline=deadline,
        )
        tokens = (
            self.models.tokenizer.encode(result.text, add_special_tokens=False)
            if result.text
            else []
        )
        stats = GenerationStats(
            strategy=STRATEGY,
            prompt_tokens=prompt_tokens,
            new_tokens=len(tokens),
            prefill_ms=result.prefill_ms,
            decode_ms=result.decode_ms,
            total_ms=result.total_ms,
        )
        return Generated(result.text, tokens, result.stop_reason, stats)

    def alternatives(
        self,
        prepared: PreparedCompletion,
        generated: Generated,
        count: int,
        *,
        within: int,
        cancel: threading.Event | None,
    ) -> list[Generated]:
        """None: a serving engine's answer cannot be forked from here (asking it for more
        samples would be other requests on everyone's capacity, and not the greedy answer's
        branches)."""
        return []

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
        """None: prompt log-probabilities are not part of the OpenAI-compatible API every
        engine serves (vLLM's `prompt_logprobs` is its own), so the veto is not asked."""
        return None

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
        """None: a next edit's rules answer alone here, as for `likelihoods` (one more request
        on a shared engine's capacity for each rule's candidate)."""
        return None

    def prefill(
        self, prompt_ids: Sequence[int], *, slot: str, model: str, cancel: threading.Event | None
    ) -> int:
        """Nothing: this backend scores nothing (`likelihoods`)."""
        return 0

    def warm(self, prepared: PreparedCompletion, cancel: threading.Event | None) -> int:
        """No work ahead: a shared engine's capacity is for real requests (it caches the
        prompt's head by itself)."""
        return 0

    @property
    def compute_path(self) -> str | None:
        return None  # the engine's own, not observable from here

    @property
    def batch_invariant(self) -> bool:
        return False

    @property
    def works_ahead(self) -> bool:
        return False  # a shared engine's capacity is for real requests

    @property
    def compute(self) -> dict[str, Any]:
        return {
            "runtime": self.models.runtime,
            "dtype": self.models.dtype,
            "kernel": None,
            "reason": self.models.runtime_reason,
            "runtimeReason": self.models.runtime_reason,
        }

    def close(self) -> None:
        self.generator.close()


def load_remote_backend(
    config: QuickdraftConfig,
    *,
    check: bool = True,
    progress: Callable[[str], None] | None = None,
) -> RemoteBackend:
    """Tokenizer files from the preset or `model.tokenizer`, the engine's client, and (with
    `check`) one question to the engine, whose answer sets `engine_status`; an engine that is
    down makes no error here: requests fail with the reason until it is back."""
    if progress is not None:
        progress("loading the tokenizer (files only, no weights)")
    backend = RemoteBackend(load_remote_models(config.model), config)
    if check:
        if progress is not None:
            progress(f"asking the completion engine at {backend.generator.endpoint.display}")
        backend.generator.check()
        backend.models.engine = backend.generator.describe()
    return backend
