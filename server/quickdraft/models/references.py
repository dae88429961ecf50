"""Model references: which models a configuration names, and where their files are.

A model reference is, in the order tried:

1. a preset name: that preset's *target* model (as `target`, with no draft set, the whole
   preset: target and draft), from `$QUICKDRAFT_HOME/models/`;
2. an existing path: a `.gguf` file (its tokenizer, and for torch its converted weights, kept
   once in `$QUICKDRAFT_HOME/converted/`) or a Hugging Face model directory;
3. a Hub id `org/name`: `$QUICKDRAFT_HOME/models/org--name/` (fetched by `quickdraft models fetch
   --source hub`), else the local Hugging Face cache, offline. Nothing is downloaded at load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download

from quickdraft.config import ModelConfig
from quickdraft.errors import ModelNotFoundError
from quickdraft.models import convert, fetch, store
from quickdraft.models.presets import PRESETS, ModelSource, Preset, default_preset


@dataclass
class ResolvedModel:
    """Where one model's files are, and what they are."""

    reference: str
    path: Path
    """The model directory: tokenizer files, and weights once converted or downloaded."""
    kind: str  # "preset-pypi" | "preset-hub" | "directory" | "gguf" | "hub-cache"
    source: ModelSource | None = None
    note: str = ""
    gguf: Path | None = None
    """The GGUF file, when there is one (llama.cpp runs it; torch converts it once)."""
    own_gguf: bool = False
    """The GGUF is quickdraft's own download (it may be deleted once converted), not a file
    the user pointed at."""


def plan_references(config: ModelConfig, device_type: str) -> tuple[Preset | None, str, str | None]:
    """(preset, target reference, draft reference or None) from the configuration."""
    draft = config.draft
    no_draft = isinstance(draft, str) and draft.strip().lower() == "none"
    if no_draft:
        draft = None
    preset: Preset | None = None
    if config.preset is not None:
        if config.preset not in PRESETS:
            raise ModelNotFoundError(
                f"unknown preset {config.preset!r}; presets: {', '.join(PRESETS)}"
            )
        preset = PRESETS[config.preset]
    target = config.target
    if target is None and preset is None:
        preset = PRESETS[default_preset(device_type)]
    if target is not None and preset is None and target in PRESETS and draft is None:
        preset = PRESETS[target]  # `--target qwen2.5-coder-1.5b` means the whole preset
        target = None
    if target is None:
        target = preset.name
    if draft is None and not no_draft and preset is not None and preset.draft is not None:
        draft = f"{preset.name}:draft"  # the preset fills each of target and draft when unset
    return preset, target, draft


def _fetch_hint(preset_name: str) -> str:
    preset = PRESETS[preset_name]
    source = "pypi" if preset.has_pypi else "hub"
    return f"quickdraft models fetch {preset_name} --source {source}"


def _preset_for_source(source: ModelSource) -> str:
    """The first preset using `source` (as target, else as draft), to name in fetch hints."""
    for name, preset in PRESETS.items():
        if preset.target is source:
            return name
    for name, preset in PRESETS.items():
        if preset.draft is source:
            return name
    raise KeyError(source.hub_id)  # pragma: no cover


def resolve_source(source: ModelSource, reference: str, home: Path | None = None) -> ResolvedModel:
    found = fetch.find_local_model(source, home)
    if found is None:
        name = _preset_for_source(source)
        where = ", ".join(str(p) for _, p in fetch.local_model_dirs(source, home))
        raise ModelNotFoundError(
            f"weights of {source.hub_id} (preset {name}) are not downloaded (looked in {where}); "
            f"fetch them with `{_fetch_hint(name)}`"
        )
    kind, path = found
    note, gguf = "", None
    if kind == "pypi" and source.pypi is not None:
        note = source.pypi.note
        gguf = store.gguf_of(path)
        if gguf is None:
            candidate = store.gguf_dir(home) / source.pypi.filename
            gguf = candidate if candidate.is_file() else None
    return ResolvedModel(reference, path, f"preset-{kind}", source, note, gguf, own_gguf=True)


def _looks_like_path(reference: str) -> bool:
    """Hub ids are exactly `org/name`; anything else with a slash or a .gguf is a path."""
    return (
        reference.startswith(("/", ".", "~"))
        or reference.endswith(".gguf")
        or reference.count("/") != 1
    )


def resolve_reference(reference: str, home: Path | None = None) -> ResolvedModel:
    """Turn a model reference into a local directory, or raise ModelNotFoundError."""
    if reference in PRESETS:
        return resolve_source(PRESETS[reference].target, reference, home)
    path = Path(reference).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix != ".gguf":
                raise ModelNotFoundError(
                    f"{reference}: a model file must be a .gguf (or give the model's directory)"
                )
            gguf = Path(os.path.abspath(path))
            directory = convert.converted_path_for(gguf, home)
            return ResolvedModel(reference, directory, "gguf", note=f"from {path.name}", gguf=gguf)
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{reference}: not a Hugging Face model directory (no config.json)"
            )
        return ResolvedModel(reference, path, "directory")
    if _looks_like_path(reference):
        known = ", ".join(PRESETS)
        raise ModelNotFoundError(
            f"{reference!r} is neither a preset ({known}), an existing file or directory, "
            "nor a Hub id of the form org/name"
        )
    return _resolve_hub_id(reference, home)


def _resolve_hub_id(hub_id: str, home: Path | None) -> ResolvedModel:
    ours = fetch.hub_model_dir(hub_id, home)
    if store.is_complete(ours):
        return ResolvedModel(hub_id, ours, "preset-hub")
    try:
        cached = snapshot_download(hub_id, local_files_only=True)
        if (Path(cached) / "config.json").is_file():
            return ResolvedModel(hub_id, Path(cached), "hub-cache")
    except Exception:  # not in the cache (LocalEntryNotFoundError and friends)
        pass
    hint = f"download it where the Hub is reachable (`hf download {hub_id}`) into the HF cache"
    users = [n for n, p in PRESETS.items() if p.target.hub_id == hub_id]
    if users:
        hint = f"fetch it with `quickdraft models fetch {users[0]} --source hub`, or " + hint
    pypi = [n for n, p in PRESETS.items() if p.target.hub_id == hub_id and p.has_pypi]
    also = (
        f"; preset {pypi[0]} has a PyPI route (a quantized Instruct variant): "
        f"`{_fetch_hint(pypi[0])}`, then use --preset {pypi[0]}"
        if pypi
        else ""
    )
    raise ModelNotFoundError(
        f"Hub model {hub_id} is not available locally (not in {ours} nor in the Hugging Face "
        f"cache; nothing is downloaded at load time): {hint}{also}"
    )


def resolve_draft(reference: str, home: Path | None = None) -> ResolvedModel:
    """The draft's files: `PRESET:draft` (what `plan_references` names a preset's draft) or any
    model reference."""
    name = reference.removesuffix(":draft")
    if name != reference and name in PRESETS:
        return resolve_source(PRESETS[name].draft, name + " (draft)", home)
    return resolve_reference(reference, home)
