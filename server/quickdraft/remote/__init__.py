"""Completions from a serving engine (vLLM, llama.cpp's server, SGLang, TGI): `backend: openai`.

```python
completer = RemoteCompleter.from_config(config)  # tokenizer files only; asks the engine once
completer.complete(request, cancel=event)        # the local pipeline, the engine generating
completer.engine_status.subscribe(listener)      # "ready" / "unavailable" changes
```

`client.py` speaks `/v1/completions` (httpx, streamed, failures classified), `generator.py` runs
it for the model worker thread with cancel and deadline, `status.py` tracks the engine's state,
`models.py` finds the family's tokenizer.
"""

from quickdraft.remote.completer import STRATEGY, RemoteCompleter
from quickdraft.remote.generator import RemoteGenerator, RemoteResult
from quickdraft.remote.models import RemoteModels, load_remote_models
from quickdraft.remote.status import EngineStatus

__all__ = [
    "STRATEGY",
    "EngineStatus",
    "RemoteCompleter",
    "RemoteGenerator",
    "RemoteModels",
    "RemoteResult",
    "load_remote_models",
]
