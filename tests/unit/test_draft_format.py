"""The draft's GGUF in its fastest format: a Q4_0 copy made once, taken only where llama.cpp's
probe measured it faster (the probe is scripted here: what is tested is the choice and the
copy, not this machine's speed)."""

from __future__ import annotations

import os

import pytest

from quickdraft.decoding import llamacpp
from quickdraft.models import draft_format
from quickdraft.models.draft_format import Q4_0, choose_draft_format, faster, file_type
from quickdraft.models.llamacpp_probe import ProbeResult

os.environ.setdefault("HF_HUB_OFFLINE", "1")
needs_llamacpp = pytest.mark.skipif(
    not llamacpp.available(), reason="llama-cpp-python is not installed"
)


def measured(step_ms: float, prefill: float, extra_bufts: bool = True) -> ProbeResult:
    return ProbeResult(
        extra_bufts=extra_bufts,
        target_ms={1: step_ms, 2: step_ms},
        prefill_tokens_per_s=prefill,
        context=256,
        threads=2,
        load_seconds=0.1,
    )


def test_the_copy_is_taken_only_when_faster_by_the_margin_and_slower_at_nothing():
    zen2 = measured(31.7, 107.0)
    assert faster(measured(25.8, 158.0), zen2)  # the 2-core Zen 2's figures
    assert faster(measured(31.7, 125.0), zen2)  # the prefill alone, by more than the margin
    assert faster(measured(28.0, 107.0), zen2)  # the step alone
    assert not faster(measured(30.0, 110.0), zen2)  # within the noise
    assert not faster(measured(20.0, 100.0), zen2)  # a faster step, a slower prefill
    assert not faster(measured(33.0, 200.0), zen2)  # a faster prefill, a slower step


@pytest.fixture
def probed(monkeypatch):
    """llama.cpp's probe answers per file (the copy's name ends in -q4_0.gguf). The copy crashed
    with the extra buffers and the original did not, as on the AMX Xeon where CI ran."""
    state = {
        "copy": measured(25.8, 158.0, extra_bufts=False),
        "original": measured(31.7, 107.0),
        "calls": [],
    }

    def probe(path, threads, **_):
        state["calls"].append(path.name)
        return state["copy" if path.name.endswith("-q4_0.gguf") else "original"]

    monkeypatch.setattr(draft_format.llamacpp_probe, "probe", probe)
    return state


@needs_llamacpp
def test_a_q4_0_copy_is_made_once_and_taken_where_it_is_faster(tmp_path, probed):
    from quickdraft.models.llamacpp import LlamaCppModel
    from quickdraft.testing import write_tiny_gguf

    write_tiny_gguf(tmp_path / "draft.gguf", seed=1, layers=1, hidden=64)
    home, said = tmp_path / "home", []
    chosen = choose_draft_format(tmp_path / "draft.gguf", 1, home=home, say=said.append)
    assert chosen.path.name == "draft-q4_0.gguf" and "faster here" in chosen.reason
    assert chosen.extra_bufts is False  # the copy's own probe, not the original's
    assert "25.8 ms against 31.7 ms" in chosen.reason
    assert any("making a Q4_0 copy" in line for line in said)
    assert file_type(chosen.path) == Q4_0 and file_type(tmp_path / "draft.gguf") == 0
    model = LlamaCppModel(chosen.path, threads=1, extra_bufts=False)
    original = LlamaCppModel(tmp_path / "draft.gguf", threads=1, extra_bufts=False)
    assert model.vocab_size == original.vocab_size and model.layers == original.layers
    model.close()
    original.close()
    # Made once: the next load reuses the copy, and only measures (from the probe's cache).
    made = chosen.path.stat().st_mtime_ns
    said.clear()
    again = choose_draft_format(tmp_path / "draft.gguf", 1, home=home, say=said.append)
    assert again.path == chosen.path and chosen.path.stat().st_mtime_ns == made
    assert not any("making" in line for line in said)
    assert any("measuring" in line for line in said)  # the scripted probe cached nothing
    # The file changes (fetched again): a new copy, and the old one is removed; a copy of
    # another file with the same name stays.
    elsewhere = tmp_path / "elsewhere" / "draft.gguf"
    elsewhere.parent.mkdir()
    write_tiny_gguf(elsewhere, seed=3, layers=1, hidden=64)
    theirs = choose_draft_format(elsewhere, 1, home=home, say=said.append).path
    write_tiny_gguf(tmp_path / "draft.gguf", seed=2, layers=1, hidden=64)
    os.utime(tmp_path / "draft.gguf", (made / 1e9 + 60, made / 1e9 + 60))
    remade = choose_draft_format(tmp_path / "draft.gguf", 1, home=home, say=said.append).path
    assert remade != chosen.path and remade.is_file() and not chosen.path.parent.exists()
    assert theirs.is_file()
    # Where it is not faster, the file as given runs.
    probed["copy"] = measured(31.0, 110.0)
    kept = choose_draft_format(tmp_path / "draft.gguf", 1, home=home, say=said.append)
    assert kept.path == tmp_path / "draft.gguf" and "not faster here" in kept.reason
    assert kept.extra_bufts is True


@needs_llamacpp
def test_a_q4_0_draft_runs_as_given_and_a_failed_copy_leaves_the_draft_as_it_was(
    tmp_path, probed, monkeypatch
):
    from quickdraft.testing import write_tiny_gguf

    write_tiny_gguf(tmp_path / "draft.gguf", seed=1, layers=1, hidden=64)
    home = tmp_path / "home"
    copy = choose_draft_format(tmp_path / "draft.gguf", 1, home=home, say=lambda _: None).path
    # The copy is Q4_0 already: nothing to make of it.
    again = choose_draft_format(copy, 1, home=home, say=lambda _: None)
    assert again.path == copy and "Q4_0 or fewer bits" in again.reason
    assert again.extra_bufts is False  # measured: the scripted probe of a copy
    # llama.cpp refusing to requantize (a broken file, a full disk): the draft as given.
    write_tiny_gguf(tmp_path / "other.gguf", seed=2, layers=1, hidden=64)
    library = draft_format.library()
    monkeypatch.setattr(library, "llama_model_quantize", lambda *args: 1)
    failed = choose_draft_format(tmp_path / "other.gguf", 1, home=home, say=lambda _: None)
    assert failed.path == tmp_path / "other.gguf" and "could not requantize" in failed.reason
    assert failed.extra_bufts is False  # unmeasured: never the buffers that may crash
    assert not list((home / "converted").glob("other-q4_0-*/other-q4_0.gguf"))


@needs_llamacpp
def test_load_models_runs_the_llamacpp_draft_from_the_format_chosen(tmp_path, monkeypatch, probed):
    from quickdraft.config import ModelConfig
    from quickdraft.models.loading import load_models
    from quickdraft.testing import write_tiny_gguf

    write_tiny_gguf(tmp_path / "target.gguf", seed=0)
    write_tiny_gguf(tmp_path / "draft.gguf", seed=1, layers=1)
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path / "home"))

    def load(**settings):
        return load_models(
            ModelConfig(
                target=str(tmp_path / "target.gguf"),
                draft=str(tmp_path / "draft.gguf"),
                runtime="llamacpp",
                threads=1,
                **settings,
            )
        )

    loaded = load()
    described = loaded.describe()
    assert described["draft"]["path"].endswith("draft-q4_0.gguf")
    assert "Q4_0 copy is faster here" in described["draft_format"]
    assert described["target"]["path"] == str(tmp_path / "target.gguf")  # the target as given
    assert " as Q4_0 (llama.cpp on cpu" in loaded.summary()
    # Each model with the buffers its own file's probe allows: the copy crashed with them (a
    # SIGSEGV at the draft's first forward, in CI, when it took the target's).
    assert loaded.target.extra_bufts is True and loaded.draft.extra_bufts is False
    loaded.draft.close()
    probed["calls"].clear()
    as_is = load(draft_format="as-is")
    assert as_is.describe()["draft"]["path"] == str(tmp_path / "draft.gguf")
    assert as_is.describe()["draft_format"] == "model.draft_format is as-is"
    assert "as Q4_0" not in as_is.summary()
    # Not compared with a copy, but measured for its own buffers.
    assert probed["calls"].count("draft.gguf") == 1 and as_is.draft.extra_bufts is True
