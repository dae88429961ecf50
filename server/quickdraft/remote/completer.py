"""`RemoteCompleter`: the completion pipeline with a serving engine where the local Engine was.

Everything up to the prompt is the local pipeline's (documents, `build_prompt`, the token
budget counted with the family's tokenizer) and so is everything after (the stop rule, now run
on the streamed text, and `finalize`). The engine does its own decoding, batching and
speculation, so there is no n-gram index to feed and no step costs to measure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from quickdraft.completer import Completer, Completion, CompletionRequest, PreparedCompletion
from quickdraft.config import QuickdraftConfig
from quickdraft.decoding import GenerationStats
from quickdraft.remote.generator import RemoteGenerator
from quickdraft.remote.models import RemoteModels, load_remote_models
from quickdraft.remote.status import EngineStatus

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


class RemoteCompleter(Completer):
    def __init__(
        self,
        models: RemoteModels,
        config: QuickdraftConfig,
        generator: RemoteGenerator | None = None,
    ) -> None:
        super().__init__(models, classic_layout(config))
        self.generator = generator or RemoteGenerator.from_config(config.model, models.stop_tokens)
        models.engine = self.generator.describe()

    @classmethod
    def from_config(
        cls,
        config: QuickdraftConfig,
        *,
        check: bool = True,
        progress: Callable[[str], None] | None = None,
    ) -> RemoteCompleter:
        """Tokenizer files from the preset or `model.tokenizer`, the engine's client, and (with
        `check`) one question to the engine, whose answer sets `engine_status`; an engine that
        is down makes no error here: requests fail with the reason until it is back."""
        if progress is not None:
            progress("loading the tokenizer (files only, no weights)")
        completer = cls(load_remote_models(config.model), config)
        if check:
            if progress is not None:
                progress(f"asking the completion engine at {completer.generator.endpoint.display}")
            completer.generator.check()
            completer.models.engine = completer.generator.describe()
        return completer

    @property
    def engine_status(self) -> EngineStatus:
        return self.generator.status

    def close(self) -> None:
        self.generator.close()

    def _create_engine(self) -> None:
        return None

    # --- what the local engine needs and a serving engine does not ------------------------

    def update_config(self, config: QuickdraftConfig) -> None:
        # Model settings (URL, key, timeouts) come with a new Completer.
        self.config = classic_layout(config)

    def calibrate(self, *args: Any, **kwargs: Any) -> None:
        return None  # the engine's step costs are its own business

    def refresh_documents(self, current: CompletionRequest | None = None) -> None:
        return None  # no local n-gram index: the engine drafts for itself

    def close_document(self, uri: str) -> None:
        self.documents.pop(uri, None)

    def anchored_draft(self, request: CompletionRequest) -> list[int] | None:
        return None

    # --- generation -----------------------------------------------------------------------

    def _generate(
        self,
        prepared: PreparedCompletion,
        *,
        cancel: threading.Event | None,
        strategy: str | None,
        deadline: float | None,
    ) -> Completion:
        decoding = self.config.decoding
        result = self.generator.generate(
            prepared.prompt.text,
            max_tokens=prepared.max_new_tokens,
            temperature=decoding.temperature,
            top_p=decoding.top_p,
            seed=decoding.seed,
            should_stop=prepared.text_stop_rule(),
            cancel=cancel,
            deadline=deadline,
        )
        raw, text = prepared.finish_text(result.text)
        tokens = self.tokenizer.encode(raw, add_special_tokens=False) if raw else []
        stats = GenerationStats(
            strategy=STRATEGY,
            prompt_tokens=len(prepared.prompt_ids),
            new_tokens=len(tokens),
            prefill_ms=result.prefill_ms,
            decode_ms=result.decode_ms,
            total_ms=result.total_ms,
        )
        return Completion(
            text=text,
            tokens=tokens,
            raw_text=raw,
            mode=prepared.mode,
            stop_reason=result.stop_reason,
            stats=stats,
            prompt_tokens=len(prepared.prompt_ids),
        )
