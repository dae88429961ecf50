"""`quickdraft complete` as a user runs it: a subprocess, tiny models, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.e2e.conftest import server_env

CODE = (
    "def total(items):\n"
    "    result = 0\n"
    "    for item in items:\n"
    "        result += item.price * item.quantity\n"
    "    return result\n"
    "\n"
    "\n"
    "def total_with_tax(items, rate):\n"
    "    result = 0\n"
    "    "
)


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quickdraft.cli", "complete", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=server_env(),
        timeout=300,
    )


@pytest.fixture()
def workspace(tmp_path, tiny_models):
    (tmp_path / "cart.py").write_text(CODE)
    models = ["--target", str(tiny_models / "target"), "--draft", str(tiny_models / "draft")]
    return tmp_path, [*models, "--no-calibrate", "--max-tokens", "24"]


def complete_json(workspace, *extra: str) -> dict:
    directory, models = workspace
    result = run("cart.py", "--line", "10", "--col", "5", "--json", *models, *extra, cwd=directory)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_every_strategy_gives_the_tokens_of_plain_decoding(workspace):
    expected = complete_json(workspace, "--strategy", "ar")
    assert expected["tokens"] and expected["target_forwards"] >= 1
    for key in (
        "completion",
        "tokens",
        "stop_reason",
        "new_tokens",
        "prefill_tokens",
        "reused_tokens",
        "target_forwards",
        "tokens_per_forward",
        "drafted_by_source",
        "accepted_by_source",
        "prefill_ms",
        "decode_ms",
    ):
        assert key in expected
    for strategy in ("ngram", "draft", "hybrid"):
        for draft_length in ("1", "4"):
            got = complete_json(workspace, "--strategy", strategy, "--draft-length", draft_length)
            assert got["tokens"] == expected["tokens"], (strategy, draft_length)
            assert got["completion"] == expected["completion"]


def test_check_identity_reports_the_path_and_the_comparison_with_ar(workspace):
    got = complete_json(workspace, "--strategy", "hybrid", "--check-identity")
    assert got["identical_to_ar"] is True
    assert got["compute_path"].startswith("torch ") and "cpu" in got["compute_path"]
    assert got["batch_invariant"] is ("int8" in got["compute_path"])
    assert "identical_to_ar" not in complete_json(workspace, "--strategy", "hybrid")


def test_settings_file_is_laid_under_the_flags(workspace):
    directory, _ = workspace
    (directory / "settings.json").write_text(json.dumps({"decoding": {"max_new_tokens": 3}}))
    assert complete_json(workspace, "--config", "settings.json")["new_tokens"] <= 24
    # --max-tokens 24 on the command line wins over the file's 3; without it the file's applies.
    directory, models = workspace
    models = [m for m in models if m not in ("--max-tokens", "24")]
    result = run(
        "cart.py",
        "--line",
        "10",
        "--col",
        "5",
        "--json",
        "--config",
        "settings.json",
        "--strategy",
        "ar",
        *models,
        cwd=directory,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["new_tokens"] <= 3
    (directory / "bad.json").write_text(json.dumps({"decoding": {"max_new_tokens": "many"}}))
    result = run(
        "cart.py", "--line", "10", "--col", "5", "--config", "bad.json", *models, cwd=directory
    )
    assert result.returncode != 0 and "decoding.max_new_tokens" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.py", "--line", "1", "--col", "1"], "no such file"),
        (["cart.py", "--line", "99", "--col", "1"], "--line 99 is out of range"),
        (["cart.py", "--line", "0", "--col", "1"], "--line 0 is out of range"),
        (["cart.py", "--line", "2", "--col", "40"], "--col 40 is out of range"),
        (
            ["cart.py", "--line", "2", "--col", "1", "--max-tokens", "0"],
            "decoding.max_new_tokens: 0 is below the minimum 1",
        ),
        (
            ["cart.py", "--line", "2", "--col", "1", "--strategy", "draft", "--draft", "none"],
            "needs a draft model",
        ),
        (["cart.py", "--line", "2", "--col", "1", "--temperature", "-1"], "temperature"),
    ],
)
def test_errors_exit_nonzero_with_one_clear_line(workspace, args, message):
    directory, models = workspace
    models = [m for m in models if m not in ("--max-tokens", "24")]
    if "--draft" in args:
        models = models[:2] + models[4:]  # the test names its own --draft
    result = run(*args, *models, cwd=directory)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines and message in lines[-1], result.stderr
    assert "Traceback" not in result.stderr


def test_models_with_different_tokenizers_are_refused(workspace, tmp_path):
    directory, models = workspace
    from tests.unit.test_models_loading import save_mismatched_draft

    draft = save_mismatched_draft(tmp_path / "other-family")
    result = run(
        "cart.py",
        "--line",
        "2",
        "--col",
        "1",
        "--target",
        models[1],
        "--draft",
        str(draft),
        cwd=directory,
    )
    assert result.returncode != 0
    assert "do not share a tokenizer" in result.stderr and "Traceback" not in result.stderr


def test_binary_file_is_refused(workspace):
    directory, models = workspace
    (directory / "blob.py").write_bytes(b"\x00\x01\x02")
    result = run("blob.py", "--line", "1", "--col", "1", *models, cwd=directory)
    assert result.returncode != 0 and "binary" in result.stderr
