"""Which backend generates, chosen by `model.backend`, and the pipelines over it.

`local`: the models loaded on this machine (`models.load_models`), then their step costs
measured (cached per machine) when the strategy can draft. `openai`: a serving engine
(`quickdraft.remote`: tokenizer files only). `quickdraft complete`, `serve` and `bench` all
load through here, so each runs the same pipeline whatever generates. The next-edit pipeline
reads the same backend and open documents as the Completer (`edit_sources`).
"""

from __future__ import annotations

from quickdraft.completer import Completer
from quickdraft.config import QuickdraftConfig
from quickdraft.context.prompt import prompt_tokens
from quickdraft.local_backend import LocalBackend
from quickdraft.models.loading import Progress, load_models
from quickdraft.next_edit import EditSources
from quickdraft.remote import load_remote_backend


def load_completer(config: QuickdraftConfig, *, progress: Progress | None = None) -> Completer:
    """Load what `config` names; every step is told to `progress`."""
    if config.model.backend == "openai":
        return Completer(load_remote_backend(config, progress=progress), config)
    # The runtimes' costs are compared on a prompt of the size this configuration sends.
    models = load_models(
        config.model, progress=progress, prompt_tokens=prompt_tokens(config.context)
    )
    if progress is not None:
        progress("setting up the KV caches")  # llama.cpp allocates its contexts: seconds
    backend = LocalBackend(models, config)
    if config.model.calibrate and needs_step_costs(config):
        backend.calibrate(progress=progress)
    return Completer(backend, config)


def edit_sources(completer: Completer) -> EditSources:
    """What a next edit reads, as `completer` holds it now: its backend, settings and open
    documents (the language server's worker owns both pipelines' state in one place)."""
    return EditSources(
        completer.backend,
        completer.prompts,
        completer.config,
        completer.documents,
        completer.head,
        completer.root,
        completer.count_tokens,
        completer.models.names(),
    )


def needs_step_costs(config: QuickdraftConfig) -> bool:
    """Whether the settings use this machine's measured step costs: a drafting strategy sizes
    its drafts by them, an `auto` prompt budget follows the prefill speed."""
    return config.decoding.strategy != "ar" or config.context.max_prompt_tokens == "auto"
