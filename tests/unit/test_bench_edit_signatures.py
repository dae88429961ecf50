"""`quickdraft bench --edits --edits-signatures`: the functions a history gave a parameter
without a default, with the argument each of their calls gained, and the next edit after the
header is typed scored against the commit's argument. A git history the test writes; the tiny
models, their generation stood in for where a written argument is needed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from quickdraft.backends import edit_sources
from quickdraft.bench.edits_signatures import mine_signature_cases, replay, summarize
from quickdraft.config import load_config
from quickdraft.decoding import GenerationResult, GenerationStats
from quickdraft.decoding.confidence import TokenChoice

BEFORE = (
    "class Store:\n"
    "    def save(self, key):\n"
    "        return key\n"
    "\n"
    "    def run(self, timeout):\n"
    "        self.save('a')\n"
    "        return self.save('b')\n"
    "\n"
    "\n"
    "def unrelated(x, y=1):\n"
    "    return x\n"
    "\n"
    "\n"
    "def inline(a): return a\n"
    "\n"
    "\n"
    "unrelated(1)\n"
    "inline(1)\n"
)
AFTER = (
    BEFORE.replace("def save(self, key):", "def save(self, key, timeout):")
    .replace("self.save('a')", "self.save('a', timeout)")
    .replace("self.save('b')", "self.save('b', 2 * timeout)")
    .replace("def unrelated(x, y=1):", "def unrelated(x, y=1, z=2):")
    .replace("def inline(a):", "def inline(a, b):")
    .replace("inline(1)", "inline(1, 2)")
)


def git(root: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_AUTHOR_DATE": "2025-03-01T12:00:00+00:00",
        "GIT_COMMITTER_DATE": "2025-03-01T12:00:00+00:00",
    }
    done = subprocess.run(
        ["git", "-C", str(root), *args], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("signatures")
    git(root, "init", "-q", "-b", "main")
    for text in (BEFORE, AFTER):
        (root / "store.py").write_text(text)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "change")
    return root


def test_a_function_that_gained_a_parameter_and_its_calls_an_argument_is_a_case(history):
    [case] = mine_signature_cases(history, "2025-01-01")
    assert (case.name, case.added) == ("save", "timeout")
    assert case.arguments == {6: "timeout", 7: "2 * timeout"}
    assert case.old_header == "    def save(self, key):\n"
    assert case.new_header == "    def save(self, key, timeout):\n"
    assert case.before == BEFORE
    # A parameter with a default (`z=2`) needs no argument, and a body on the header's line
    # leaves no line to type alone: neither is a case.
    assert mine_signature_cases(history, "2026-01-01") == []  # nothing that late


@pytest.fixture(scope="module")
def completer():
    from quickdraft.testing import build_tiny_loaded_models, local_completer

    return local_completer(build_tiny_loaded_models(), load_config({}))


def test_the_next_edit_is_scored_against_the_commit_s_argument(history, completer, monkeypatch):
    [case] = mine_signature_cases(history, "2025-01-01")
    sources = edit_sources(completer)
    engine = completer.backend.engine
    monkeypatch.setattr(engine, "likelihoods", None)
    # `run` binds `timeout`: the same-named variable is passed, no model asked.
    monkeypatch.setattr(engine, "generate", None)
    same = replay(case, sources)
    assert (same["verdict"], same["text"], same["written"]) == ("same", ", timeout", False)
    # Without it the model writes the argument; `2` is not the commit's `timeout`.
    unbound = case.__class__(
        **{
            **case.__dict__,
            "before": case.before.replace("def run(self, timeout):", "def run(self):"),
            "start": case.start,
        }
    )
    tokens = completer.tokenizer.encode("2)", add_special_tokens=False)
    choices = [TokenChoice(0.0, 0, -9.0) for _ in tokens]
    monkeypatch.setattr(
        engine, "generate", lambda g: GenerationResult(tokens, "stop", GenerationStats(), choices)
    )
    other = replay(unbound, sources)
    assert (other["verdict"], other["text"], other["written"]) == ("other argument", ", 2", True)
    summary = summarize([same, other])
    assert (summary["same"], summary["other argument"], summary["written"]) == (1, 1, 1)
    assert summary["written_same"] == 0 and summary["functions"] == 2
