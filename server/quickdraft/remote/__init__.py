"""Completions from a serving engine (vLLM, llama.cpp's server, SGLang, TGI): `backend: openai`.

```python
backend = load_remote_backend(config)  # tokenizer files only; asks the engine once
completer = Completer(backend, config)  # the one pipeline, the engine generating
backend.engine_status.subscribe(listener)  # "ready" / "unavailable" changes
```

`backend.py` is the pipelines' `Backend` (generation.Backend) (the prompt as the engine's body, its answer read back),
`client.py` speaks `/v1/completions` (httpx, streamed, failures classified), `generator.py` runs
it for the model worker thread with cancel and deadline, `status.py` tracks the engine's state,
`models.py` finds the family's tokenizer.
"""

from quickdraft.remote.backend import STRATEGY, RemoteBackend, load_remote_backend
from quickdraft.remote.generator import RemoteGenerator, RemoteResult
from quickdraft.remote.models import RemoteModels, load_remote_models
from quickdraft.remote.status import EngineStatus

__all__ = [
    "STRATEGY",
    "EngineStatus",
    "RemoteBackend",
    "RemoteGenerator",
    "RemoteModels",
    "RemoteResult",
    "load_remote_backend",
    "load_remote_models",
]
