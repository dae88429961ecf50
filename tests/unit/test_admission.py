"""The one gate (admission.refusal): every path asks it, so every path refuses alike."""

from __future__ import annotations

import pytest

from quickdraft.admission import Refusal, refusal
from quickdraft.config import load_config


@pytest.mark.parametrize("feature", ["completion", "edit"])
def test_a_usable_document_in_an_enabled_language_passes(feature):
    assert refusal(load_config({}), feature, "python", "def f():\n    return 1\n") is None


def test_a_language_switched_off_is_refused_as_settings_ask_for():
    config = load_config({"languages": {"python": {"enabled": False}}})
    for feature in ("completion", "edit"):
        refused = refusal(config, feature, "python", "x = 1\n")
        assert refused == Refusal("completion disabled for python", "info")
    assert refusal(config, "completion", "rust", "fn main() {}\n") is None


def test_next_edits_switched_off_refuse_edits_only():
    config = load_config({"edits": {"enabled": False}})
    assert str(refusal(config, "edit", "python", "x = 1\n")) == (
        "next edits are disabled (edits.enabled)"
    )
    assert refusal(config, "completion", "python", "x = 1\n") is None


@pytest.mark.parametrize(
    ("text", "says"),
    [("x = 1\n" * 100, "larger than"), ("x = 1\x00\n", "NUL")],
)
def test_huge_and_binary_documents_are_warnings(text, says):
    config = load_config({"context": {"max_document_bytes": 200}})
    for feature in ("completion", "edit"):
        refused = refusal(config, feature, "python", text)
        assert refused is not None and refused.level == "warning"
        assert says in refused.reason
