"""The pipeline shared by complete, serve and bench."""

from __future__ import annotations

import pytest

from quickdraft.completer import Completer, CompletionRequest
from quickdraft.config import load_config
from quickdraft.errors import PositionError
from quickdraft.testing import build_tiny_loaded_models, ngram_source_tokens

TEXT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    "
URI = "file:///work/x.py"


@pytest.fixture(scope="module")
def models():
    return build_tiny_loaded_models()


def make(models, **settings):
    return Completer(models, load_config({"decoding": {"max_new_tokens": 12}, **settings}))


def request(text=TEXT, line=4, character=4, language="python"):
    return CompletionRequest(URI, text, line, character, language)


def test_every_strategy_gives_the_same_tokens(models):
    completer = make(models)
    completer.set_document("file:///work/y.py", "def sub(a, b):\n    return a - b\n", "python")
    results = {
        s: completer.complete(request(), strategy=s) for s in ("ar", "ngram", "draft", "hybrid")
    }
    assert results["ar"].tokens
    for strategy, completion in results.items():
        assert completion.tokens == results["ar"].tokens, strategy
        assert completion.text == results["ar"].text


def test_open_documents_feed_the_ngram_index_and_leave_it_when_closed(models):
    completer = make(models)
    completer.set_document("file:///work/y.py", "print('hello')\n", "python")
    completer.complete(request())
    assert "file:///work/y.py" in completer.engine.ngram.sources
    before = ngram_source_tokens(completer.engine.ngram, "file:///work/y.py")
    completer.set_document("file:///work/y.py", "print('hello world')\n", "python")
    completer.complete(request())
    assert ngram_source_tokens(completer.engine.ngram, "file:///work/y.py") != before
    completer.close_document("file:///work/y.py")
    assert "file:///work/y.py" not in completer.engine.ngram.sources


def test_the_current_document_is_indexed_split_at_the_cursor(models):
    """Indexed whole, the text before the cursor would match itself and propose what follows
    the cursor; split, a lookup on it finds the other file's continuation."""
    completer = make(models)
    text = "def sub(a, b):\n    return a - b\n\nvalue = sub(3, 1)\nother = sub(\n"
    completer.set_document(URI, text, "python")
    completer.set_document("file:///work/z.py", "other = sub(9, 4)\n", "python")
    completer.refresh_documents(current=request(text, line=4, character=len("other = sub(")))
    encode = completer.tokenizer.encode
    ngram = completer.engine.ngram
    assert ngram_source_tokens(ngram, URI) == encode(text[: text.index("other")] + "other = sub(")
    assert ngram_source_tokens(ngram, URI + "#after-cursor") == encode("\n")
    match = ngram.lookup(encode("other = sub("), 4)
    assert match is not None and match.source == "file:///work/z.py"
    prepared = completer.prepare(request(text, line=4, character=len("other = sub(")))
    marker = prepared.prompt.text.rindex("<|fim_suffix|>")
    assert prepared.prompt_ids[: prepared.cursor] == encode(prepared.prompt.text[:marker])
    # Once it is no longer the request's document, it is indexed whole again.
    completer.complete(request(text, line=1, character=4))
    completer.refresh_documents()
    assert ngram_source_tokens(ngram, URI) == encode(text)
    assert URI + "#after-cursor" not in ngram.sources


def test_the_continuation_of_the_text_before_the_cursor_in_an_open_file_is_drafted_first(models):
    completer = make(models)
    text = "import os\nfrom pkg.tools import (alpha, beta, "
    completer.set_document(
        "file:///work/t.py", "from pkg.tools import (alpha, beta, gamma)\n", "python"
    )
    at_cursor = request(text, line=1, character=len(text) - 10)
    assert completer.prepare(at_cursor).anchored_draft == completer.tokenizer.encode("gamma)\n")
    completer.close_document("file:///work/t.py")
    assert completer.prepare(at_cursor).anchored_draft is None


def test_other_open_files_appear_in_the_prompt_but_not_the_current_one(models):
    completer = make(models)
    completer.set_document(URI, TEXT, "python")
    completer.set_document(
        "file:///work/helpers.py", "def sub(a, b):\n    return a - b\n", "python"
    )
    prompt = completer.build_prompt(request()).text
    assert "helpers.py" in prompt and "return a - b" in prompt
    assert prompt.count("def add(a, b)") == 1


def test_disabled_language_huge_and_binary_documents_are_skipped(models):
    completer = make(models, languages={"python": {"enabled": False}})
    assert completer.complete(request()).skipped.startswith("completion disabled")
    completer = make(models, context={"max_document_bytes": 100})
    big = "x = 1\n" * 100
    assert "larger than" in completer.complete(request(big, 3, 0)).skipped
    completer = make(models)
    assert "binary" in completer.complete(request("a\x00b\n", 0, 1)).skipped
    # A binary open document is not indexed, and does not break completion elsewhere.
    completer.set_document("file:///work/blob.bin", "\x00\x01\x02", None)
    assert completer.complete(request()).skipped is None
    assert "file:///work/blob.bin" not in completer.engine.ngram.sources


def test_positions_outside_the_document_raise_position_error(models):
    completer = make(models)
    with pytest.raises(PositionError):
        completer.complete(request(line=99))
    with pytest.raises(PositionError):
        completer.complete(request(line=0, character=500))


def other_processes_use(monkeypatch, share: float) -> None:
    """Make the machine look this busy to calibration, whatever it really is doing."""
    from quickdraft.models import cpu_kernels

    class Load:
        def __enter__(self):
            self.share = share
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(cpu_kernels, "OtherLoad", Load)


def test_calibration_is_measured_once_and_cached(models, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path))
    other_processes_use(monkeypatch, 0.0)
    completer = make(models)
    costs = completer.calibrate(context_tokens=24)
    assert costs.measured and not costs.busy
    assert list((tmp_path / "calibration").glob("*.json"))
    again = make(models)

    def fail(*args, **kwargs):
        raise AssertionError("calibrated twice")

    monkeypatch.setattr(again.engine, "calibrate", fail)
    assert again.calibrate(context_tokens=24) == costs
    assert again.engine.cost_model == costs


def test_calibration_on_a_busy_machine_is_not_kept(models, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path))
    other_processes_use(monkeypatch, 0.9)
    completer = make(models)
    steps: list[str] = []
    costs = completer.calibrate(context_tokens=24, progress=steps.append)
    assert costs.busy and completer.engine.cost_model is costs  # used for this run
    assert not list((tmp_path / "calibration").glob("*.json"))  # but not kept
    assert steps and "step costs" in steps[0]


def test_calibration_stays_within_its_budget(models, monkeypatch):
    """A machine where every forward is slow: calibration measures what fits in its budget,
    fills in the rest, and stops."""
    import time

    completer = make(models)
    runner = completer.engine.target
    original = runner.forward

    def slow(tokens, **kwargs):
        time.sleep(0.05)
        return original(tokens, **kwargs)

    monkeypatch.setattr(runner, "forward", slow)
    started = time.monotonic()
    costs = completer.engine.calibrate(context_tokens=64, budget_s=0.5)
    assert time.monotonic() - started < 1.5
    assert sorted(costs.target_ms) == [1, 2, 4, 8, 16]
    measured = costs.notes["measured_sizes"].split(",")
    assert "1" in measured and len(measured) < 5


def test_preset_draft_lengths_apply_under_the_users_settings(models):
    import dataclasses

    from quickdraft.models.presets import PRESETS

    preset = dataclasses.replace(
        PRESETS["qwen2.5-coder-1.5b"], draft_lengths={"python": 3, "rust": 6}
    )
    with_preset = dataclasses.replace(models, preset=preset)
    completer = Completer(with_preset, load_config({}))
    assert completer.draft_length_for("python") == 3
    assert completer.draft_length_for("go") is None  # the cost model chooses
    completer = Completer(with_preset, load_config({"languages": {"python": {"draftLength": 5}}}))
    assert (completer.draft_length_for("python"), completer.draft_length_for("rust")) == (5, 6)
    completer = Completer(with_preset, load_config({"decoding": {"draft_length": 2}}))
    assert completer.draft_length_for("rust") == 2
    assert Completer(models, load_config({})).draft_length_for("python") is None
