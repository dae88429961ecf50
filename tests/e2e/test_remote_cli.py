"""`quickdraft complete` and `quickdraft bench` with a serving engine (llama.cpp's server on the
0.5B GGUF, llamacpp_engine.py): the same flags as `serve`, the same text as the engine answers
directly, a clear one-line error when it is down, and the bench's `remote` strategy."""

from __future__ import annotations

import json

import pytest
from conftest import ENGINE_KEY_ENV
from llamacpp_engine import PRESET, direct_completion, free_port, unavailable_reason

from quickdraft.cli import main

pytestmark = pytest.mark.timeout(300)

SOURCE = "def fibonacci(n):\n    if n < 2:\n        return n\n    return \n"


def remote_flags(url: str) -> list[str]:
    return ["--backend", "openai", "--url", url, "--api-key-env", ENGINE_KEY_ENV]


def test_complete_prints_what_the_engine_answers(llama_engine, tmp_path, capsys):
    from quickdraft.completer import Completer
    from quickdraft.config import load_config
    from quickdraft.generation import CompletionRequest
    from quickdraft.remote import load_remote_backend

    path = tmp_path / "fib.py"
    path.write_text(SOURCE)
    argv = ["complete", str(path), "--line", "4", "--col", "12", "--preset", PRESET]
    argv += ["--max-tokens", "10", "--json", *remote_flags(llama_engine.url)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)

    config = load_config(
        {
            "model": {"backend": "openai", "url": llama_engine.url, "preset": PRESET},
            "decoding": {"max_new_tokens": 10},
        }
    )
    reference = Completer(load_remote_backend(config, check=False), config)
    try:
        uri = path.resolve().as_uri()
        reference.set_document(uri, SOURCE, "python")
        prepared = reference.prepare(CompletionRequest(uri, SOURCE, 3, 11, "python"))
        raw = direct_completion(
            llama_engine, prepared.prompt.text, 10, reference.backend.generator.stop_strings
        )
    finally:
        reference.close()
    assert printed["completion"] == prepared.finish_text(raw)[1] and printed["completion"]
    assert printed["strategy"] == "remote" and printed["new_tokens"] == len(printed["tokens"])


def test_complete_with_the_engine_down_says_so_in_one_line(tmp_path, capsys, engine_key):
    if unavailable_reason() is not None:  # the preset's tokenizer comes from the same files
        pytest.skip(unavailable_reason())
    path = tmp_path / "a.py"
    path.write_text("x = \n")
    url = f"http://127.0.0.1:{free_port()}/v1"
    argv = ["complete", str(path), "--line", "1", "--col", "5", "--preset", PRESET]
    assert main([*argv, *remote_flags(url)]) == 2
    err = capsys.readouterr().err  # progress lines, then the error in one line
    assert engine_key not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            f"quickdraft: error: cannot reach the completion engine at {url}: Connection refused"
        )
    )


def test_bench_times_the_remote_strategy_on_the_same_holes(
    llama_engine, tiny_models, tmp_path, capsys
):
    from quickdraft.models import fetch
    from quickdraft.models.presets import PRESETS

    found = fetch.find_local_model(PRESETS[PRESET].target)
    if found is None:
        pytest.skip(f"the {PRESET} tokenizer files are not fetched")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "shapes.py").write_text(
        "class Rect:\n    def __init__(self, w, h):\n        self.w = w\n        self.h = h\n\n"
        "    def area(self):\n        return self.w * self.h\n\n"
        "    def perimeter(self):\n        return 2 * (self.w + self.h)\n"
    )
    out = tmp_path / "out"
    argv = ["bench", "--repo", str(repo), "--target", str(tiny_models / "target")]
    argv += ["--draft", "none", "--device", "cpu", "--quick", "--holes", "2", "--no-progress"]
    argv += ["--no-replay", "--out", str(out), "--strategies", "ar,remote"]
    argv += ["--remote-url", llama_engine.url, "--api-key-env", ENGINE_KEY_ENV]
    argv += ["--tokenizer", str(found[1]), "--family", "qwen2.5-coder"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert "remote" not in results["env"]["skipped"]
    assert results["env"]["peers"]["remote"]["url"] == llama_engine.url
    assert results["holes"]
    for hole in results["holes"]:
        run = hole["runs"]["remote"]
        assert run["latency_ms"] > 0 and isinstance(run["completion"], str)
        assert run["new_tokens"] == len(run["tokens"])
    assert results["summary"]["remote"]["p50_ms"] > 0
    assert "remote" in (out / "report.md").read_text()
    assert "remote" in capsys.readouterr().out
