"""The pipeline shared by complete, serve and bench."""

from __future__ import annotations

import dataclasses

import pytest

from quickdraft.completer import Completer, CompletionRequest
from quickdraft.config import load_config
from quickdraft.errors import PositionError
from quickdraft.local_backend import LocalBackend
from quickdraft.testing import build_tiny_loaded_models

TEXT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    "
URI = "file:///work/x.py"


@pytest.fixture(scope="module")
def models():
    return build_tiny_loaded_models()


def local_completer(models, config):
    return Completer(LocalBackend(models, config), config)


def make(models, **settings):
    return local_completer(models, load_config({"decoding": {"max_new_tokens": 12}, **settings}))


def request(text=TEXT, line=4, character=4, language="python", uri=URI):
    return CompletionRequest(uri, text, line, character, language)


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


class Recording:
    """The Completer's backend, recording what the Completer hands it (the Backend interface:
    index_documents, forget_document); everything else is the LocalBackend's."""

    def __init__(self, backend):
        self.backend = backend
        self.indexed: list[tuple[dict[str, str], object]] = []
        self.forgotten: list[str] = []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def index_documents(self, documents, current):
        self.indexed.append(({uri: d.text for uri, d in documents.items()}, current))
        self.backend.index_documents(documents, current)

    def forget_document(self, uri):
        self.forgotten.append(uri)
        self.backend.forget_document(uri)


def recording(models, **settings) -> tuple[Completer, Recording]:
    config = load_config({"decoding": {"max_new_tokens": 12}, **settings})
    backend = Recording(LocalBackend(models, config))
    return Completer(backend, config), backend


def test_each_answer_says_what_its_stages_took(models):
    completer = make(models)
    completion = completer.complete(request())
    stages = completion.stages
    assert list(stages) == [
        "context_ms",
        "tokenize_ms",
        "index_ms",
        "prefill_ms",
        "decode_ms",
        "postprocess_ms",
    ]
    assert all(value >= 0 for value in stages.values())
    # Prefill is the engine's own figure; the stages together are the request's latency.
    assert stages["prefill_ms"] == round(completion.stats.prefill_ms, 2)
    assert sum(stages.values()) <= completion.latency_ms + 0.1


def test_open_documents_are_shown_to_the_backend_and_forgotten_when_closed(models):
    """What the index makes of them is test_document_index.py's."""
    completer, backend = recording(models)
    y = "file:///work/y.py"
    completer.set_document(y, "print('hello')\n", "python")
    completer.complete(request())
    documents, current = backend.indexed[-1]
    assert documents[y] == "print('hello')\n" and current.uri == URI
    completer.set_document(y, "print('hello world')\n", "python")
    completer.complete(request())
    assert backend.indexed[-1][0][y] == "print('hello world')\n"
    assert backend.forgotten == []
    completer.close_document(y)
    assert backend.forgotten == [y]
    completer.complete(request())
    assert y not in backend.indexed[-1][0]


def test_the_current_document_is_shown_with_its_cursor(models):
    """The backend is told which document is completed and where (it splits that one at the
    cursor: test_document_index.py); the prompt's text before and after the cursor too."""
    completer, backend = recording(models)
    text = "def sub(a, b):\n    return a - b\n\nvalue = sub(3, 1)\nother = sub(\n"
    completer.set_document(URI, text, "python")
    completer.set_document("file:///work/z.py", "other = sub(9, 4)\n", "python")
    cursor = request(text, line=4, character=len("other = sub("))
    completer.refresh_documents(current=cursor)
    assert backend.indexed[-1] == (
        {URI: text, "file:///work/z.py": "other = sub(9, 4)\n"},
        cursor,
    )
    encode = completer.tokenizer.encode
    prepared = completer.prepare(cursor)
    # (the append layout heals the last token: the model writes it again first)
    before = completer.tokenizer.decode(prepared.before_cursor) + prepared.healed
    assert before == text[: text.index("other")] + "other = sub("
    assert prepared.after_cursor == encode("\n")
    # A request in another document makes that one the current document.
    other = request(text, line=1, character=4, uri="file:///work/other.py")
    completer.complete(other)
    assert backend.indexed[-1][1] == other


def test_the_continuation_of_the_text_before_the_cursor_in_an_open_file_is_drafted_first(models):
    completer = make(models)
    text = "import os\nfrom pkg.tools import (alpha, beta, "
    completer.set_document(
        "file:///work/t.py", "from pkg.tools import (alpha, beta, gamma)\n", "python"
    )
    at_cursor = request(text, line=1, character=len(text) - 10)
    prepared = completer.prepare(at_cursor)
    # What followed in the open file, after the healed characters the model writes first.
    assert prepared.anchored_draft == completer.tokenizer.encode(prepared.healed + "gamma)\n")
    completer.close_document("file:///work/t.py")
    # Nothing to copy from: only the healed characters are known.
    assert completer.prepare(at_cursor).anchored_draft == completer.tokenizer.encode(
        prepared.healed
    )


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
    # A binary open document does not break completion elsewhere (that it is not indexed:
    # test_document_index.py).
    completer.set_document("file:///work/blob.bin", "\x00\x01\x02", None)
    assert completer.complete(request()).skipped is None


def test_positions_outside_the_document_raise_position_error(models):
    completer = make(models)
    with pytest.raises(PositionError):
        completer.complete(request(line=99))
    with pytest.raises(PositionError):
        completer.complete(request(line=0, character=500))


def other_processes_use(monkeypatch, share: float) -> None:
    """Make the machine look this busy to calibration, whatever it really is doing."""
    from quickdraft.decoding import costmodel

    class Load:
        def __enter__(self):
            self.share = share
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(costmodel, "OtherLoad", Load)


def forwards_on_a_fake_clock(monkeypatch, runner, seconds) -> list[float]:
    """Make time advance only with `runner`'s forwards, by `seconds(tokens)` each; the list
    returned fills with the clock's reading as each forward starts."""
    import time

    clock = [1000.0]
    started_at: list[float] = []
    original = runner.forward

    def forward(tokens, **kwargs):
        started_at.append(clock[0])
        clock[0] += seconds(tokens)
        return original(tokens, **kwargs)

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(runner, "forward", forward)
    return started_at


def test_calibration_is_measured_once_and_cached(models, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path))
    other_processes_use(monkeypatch, 0.0)
    completer = make(models)
    costs = completer.backend.calibrate(context_tokens=24)
    assert costs.measured and not costs.busy
    assert list((tmp_path / "calibration").glob("*.json"))
    again = make(models)

    def fail(*args, **kwargs):
        raise AssertionError("calibrated twice")

    monkeypatch.setattr(again.backend.engine, "calibrate", fail)
    assert again.backend.calibrate(context_tokens=24) == costs
    assert again.backend.engine.cost_model == costs


def test_calibration_on_a_busy_machine_is_not_kept(models, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path))
    other_processes_use(monkeypatch, 0.9)
    completer = make(models)
    steps: list[str] = []
    costs = completer.backend.calibrate(context_tokens=24, progress=steps.append)
    assert costs.busy and completer.backend.engine.cost_model is costs  # used for this run
    assert not list((tmp_path / "calibration").glob("*.json"))  # but not kept
    assert steps and "step costs" in steps[0]


def test_calibration_stays_within_its_budget(models, monkeypatch):
    """A machine where every target forward takes 62.5 ms (a fake clock that only forwards
    advance): calibration starts no forward once its 0.5 s budget is spent, measures what
    fitted, fills in the rest, and reports the measured costs as they were."""
    completer = make(models)
    # 62.5 ms is exact in binary: the sums below are exact too.
    started_at = forwards_on_a_fake_clock(
        monkeypatch, completer.backend.engine.target, lambda tokens: 0.0625
    )
    costs = completer.backend.engine.calibrate(context_tokens=64, budget_s=0.5)
    assert started_at and max(started_at) < 1000.5  # no target forward after the budget
    assert len(started_at) == 8  # and the budget was used: 8 x 62.5 ms
    measured = [int(n) for n in costs.notes["measured_sizes"].split(",")]
    assert 1 in measured and len(measured) < 5
    assert all(costs.target_ms[n] == 62.5 for n in measured)
    assert sorted(costs.target_ms) == [1, 2, 4, 8, 16, 32]


def test_calibration_times_the_sizes_in_turns(models, monkeypatch):
    """A burst of noise (another process, the VM's neighbours) makes three forwards in a row
    four times slower, from the first 8-token one: the sizes are timed in turns, so 8 tokens
    still has a sample outside the burst and is measured at its cost, not the burst's (timed
    one size after another, all three of its forwards fell in the burst). On this fake clock
    a forward of n new tokens takes (16 + n) / 256 s: a wider one costs more, so no other
    size's figure hides a wrong one (`fill_sizes`)."""
    completer = make(models)
    burst: list[int] = []
    started = [False]

    def seconds(tokens):
        if len(tokens) == 8 and not started[0]:
            started[0] = True
            burst.extend([4, 4, 4])
        return (16 + len(tokens)) / 256 * (burst.pop() if burst else 1)

    forwards_on_a_fake_clock(monkeypatch, completer.backend.engine.target, seconds)
    costs = completer.backend.engine.calibrate(context_tokens=64, repeats=2, budget_s=3600.0)
    assert costs.target_ms == {n: (16 + n) / 256 * 1000 for n in (1, 2, 4, 8, 16, 32)}


def test_preset_draft_lengths_apply_under_the_users_settings(models):
    import dataclasses

    from quickdraft.models.presets import PRESETS

    preset = dataclasses.replace(
        PRESETS["qwen2.5-coder-1.5b"], draft_lengths={"python": 3, "rust": 6}
    )
    with_preset = dataclasses.replace(models, preset=preset)
    completer = local_completer(with_preset, load_config({}))
    assert completer.backend.draft_length_for("python") == 3
    assert completer.backend.draft_length_for("go") is None  # the cost model chooses
    completer = local_completer(
        with_preset, load_config({"languages": {"python": {"draftLength": 5}}})
    )
    assert (
        completer.backend.draft_length_for("python"),
        completer.backend.draft_length_for("rust"),
    ) == (5, 6)
    completer = local_completer(with_preset, load_config({"decoding": {"draft_length": 2}}))
    assert completer.backend.draft_length_for("rust") == 2
    assert local_completer(models, load_config({})).backend.draft_length_for("python") is None


# --- the append layout and token healing -----------------------------------------------------

FILE = "".join(f"def f_{i}(x):\n    return x + {i}\n\n" for i in range(12))


def append_completer(models, **context):
    return make(models, context={"layout": "append", "anchor_lines": 8, **context})


def prepared_after_typing(completer, text: str, line: int, typed: str):
    """Type `typed` at the end of `line`, one character at a time; the prepared request after
    each keystroke."""
    lines = text.split("\n")
    out = []
    for n in range(1, len(typed) + 1):
        current = lines[:line] + [lines[line] + typed[:n]] + lines[line + 1 :]
        body = "\n".join(current)
        out.append(completer.prepare(request(body, line, len(lines[line]) + n)))
    return out


def test_append_layout_puts_the_anchor_to_cursor_text_after_the_middle_marker(models):
    completer = append_completer(models)
    text = FILE + "value = f_3("  # on line 36: the anchor (8 lines a window) is line 32
    prompt = completer.build_prompt(request(text, 36, len("value = f_3(")))
    assert prompt.layout == "append" and prompt.anchor_line == 32
    lines = text.split("\n")
    assert prompt.middle == "\n".join(lines[32:36]) + "\nvalue = f_3("
    assert prompt.text.endswith("<|fim_middle|>" + prompt.middle)
    assert prompt.text.index("<|fim_suffix|>") < prompt.text.index("<|fim_middle|>")
    assert prompt.prefix.endswith(prompt.middle)  # the text before the cursor, for the rules


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two prompts share."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_typing_only_appends_to_the_prompt(models):
    completer = append_completer(models)
    text = FILE + "    \n" + FILE
    steps = prepared_after_typing(completer, text, 36, "total = f_1(2) + f_2(3)")
    for before, after in zip(steps, steps[1:], strict=False):
        shared = shared_prefix(before.prompt_ids, after.prompt_ids)
        # Everything but (at most) the healed last token stays: a keystroke costs its own.
        assert shared >= len(before.prompt_ids) - 1
        assert len(after.prompt_ids) - shared <= 2


def _trie(i: int) -> str:
    return (
        f"struct trie_{i} {{\n"
        "    void insert(const char * key, size_t len, int value = 0) {\n"
        "        if (len == 0) {\n"
        "            this->has_value = true;\n"
        "            return;\n"
        "        }\n"
        "        char c = key[0];\n"
        "        auto res = children.find(c);\n"
        "        if (res != children.end()) {\n"
        "            res->second.insert(key + 1, len - 1, value);\n"
        "        } else {\n"
        f"            children.insert(std::make_pair(c, trie_{i}()));\n"
        "        }\n"
        "    }\n"
        f"    std::map<char, trie_{i}> children;\n"
        "    bool has_value = false;\n"
        "};\n\n"
    )


def test_typing_only_appends_even_when_the_suffix_is_cut(models):
    """The suffix ends before a top-level statement where the budget cuts it, found by
    parsing: the half-typed line, with its open brackets, must not move that end (it did, by
    the parser's error recovery, and every such keystroke recomputed the whole middle)."""
    completer = make(models, context={"layout": "append", "max_prompt_tokens": 3000})
    lines = "".join(_trie(i) for i in range(12)).split("\n")
    line = 18 * 2 + 9
    typed = lines[line][12:]
    assert typed == "res->second.insert(key + 1, len - 1, value);"
    lines[line] = lines[line][:12]
    steps = prepared_after_typing(completer, "\n".join(lines), line, typed)
    assert steps[0].prompt.suffix_truncated
    for before, after in zip(steps, steps[1:], strict=False):
        assert after.prompt.suffix_end_line == before.prompt.suffix_end_line
        shared = shared_prefix(before.prompt_ids, after.prompt_ids)
        assert shared >= len(before.prompt_ids) - 1


def test_enter_only_appends_to_the_prompt(models):
    completer = append_completer(models)
    text = FILE + "x = 1\n" + FILE
    lines = text.split("\n")
    first = completer.prepare(request(text, 36, 5))
    pressed = "\n".join(lines[:36] + ["x = 1", ""] + lines[37:])
    second = completer.prepare(request(pressed, 37, 0))
    assert second.prompt.anchor_line == first.prompt.anchor_line == 32
    shared = sum(1 for a, b in zip(first.prompt_ids, second.prompt_ids, strict=False) if a == b)
    assert shared >= len(first.prompt_ids) - 1


def test_token_healing_backs_off_the_last_token_and_writes_it_first(models):
    completer = append_completer(models)
    text = FILE + "result = f_1"
    prepared = completer.prepare(request(text, 36, len("result = f_1")))
    # The tiny tokenizer spells one byte per token: the last character is healed.
    assert prepared.healed == "1"
    assert completer.tokenizer.decode(prepared.prompt_ids).endswith("result = f_")
    assert prepared.anchored_draft[0] == completer.tokenizer.encode("1")[0]
    completion = completer.complete(request(text, 36, len("result = f_1")))
    decoded = completer.tokenizer.decode(completion.tokens)
    # The constraint made the model write the healed "1" first; it is not inserted again.
    assert decoded == "1" + completion.raw_text


def test_every_strategy_gives_the_same_tokens_with_healing(models):
    completer = append_completer(models)
    completer.set_document("file:///work/y.py", FILE, "python")
    text = FILE + "result = f_1"
    results = {
        s: completer.complete(request(text, 36, len("result = f_1")), strategy=s)
        for s in ("ar", "ngram", "draft", "hybrid")
    }
    assert results["ar"].tokens
    for strategy, completion in results.items():
        assert completion.tokens == results["ar"].tokens, strategy


def test_a_keystroke_in_a_two_megabyte_document_does_bounded_work(models):
    """Count tokenizer characters and n-gram tokens per keystroke: they do not grow with the
    document (a 2 MB file costs what a small one does)."""
    completer = append_completer(models, max_prompt_tokens=512, snippet_share=0.0)

    def work_per_keystroke(text: str) -> tuple[int, int]:
        line = text.count("\n") // 2
        lines = text.split("\n")
        base = "\n".join(lines[:line] + ["y = "] + lines[line + 1 :])
        completer.set_document(URI, base, "python")
        completer.refresh_documents(current=request(base, line, 4))
        completer.prepare(request(base, line, 4))
        chars, indexed = (
            completer.prompts.cache.encoded_chars,
            completer.backend.index.indexed_tokens,
        )
        typed = "\n".join(lines[:line] + ["y = f"] + lines[line + 1 :])
        offset = len("\n".join(lines[:line])) + 1 + 5
        typed_request = CompletionRequest(URI, typed, line, 5, "python", offset=offset)
        completer.set_document(URI, typed, "python")
        completer.refresh_documents(current=typed_request)
        completer.prepare(typed_request)
        return (
            completer.prompts.cache.encoded_chars - chars,
            completer.backend.index.indexed_tokens - indexed,
        )

    small = work_per_keystroke(FILE * 20)
    huge = work_per_keystroke(FILE * 40000)  # ~1.3 MB... then grown past 2 MB
    huge2 = work_per_keystroke(FILE * 70000)
    assert len(FILE * 70000) > 2_000_000
    assert huge[0] <= 4 * max(small[0], 200) and huge2[0] <= 4 * max(small[0], 200)
    assert huge[1] <= 4 * max(small[1], 200) and huge2[1] <= 4 * max(small[1], 200)


# --- work ahead: caches per document, warm-up, preemption --------------------------------------

OTHER = "def mul(a, b):\n    return a * b\n\n" * 6 + "def square(x):\n    return "


def test_switching_files_and_back_reuses_each_files_cache(models):
    completer = make(models, decoding={"max_new_tokens": 4})
    here = request(FILE + "value = f_", 36, len("value = f_"))
    there = CompletionRequest("file:///work/other.py", OTHER, 13, 11, "python")
    first = completer.complete(here)
    completer.complete(there)
    back = completer.complete(here)
    assert first.stats.slot == back.stats.slot == URI
    assert back.stats.prefill_tokens <= 4  # the last prompt token and what was generated
    assert back.stats.reused_tokens >= first.stats.prompt_tokens - 2
    assert sorted(s for s in completer.backend.engine.target.slots if s) == sorted(
        [URI, "file:///work/other.py"]
    )


def test_idle_warm_up_leaves_the_request_only_its_last_tokens(models):
    completer = make(models, context={"layout": "append"}, decoding={"max_new_tokens": 4})
    text = FILE + "value = f_"
    computed = completer.warm(request(text, 36, len("value = f_")))
    assert computed > 100
    completion = completer.complete(request(text, 36, len("value = f_")))
    assert completion.stats.prefill_tokens <= 2


def test_a_warm_up_stops_after_its_chunk_when_a_request_comes(models):
    """Preemption: the background job's cancel event is set while it prefills; the chunk
    running finishes (the next request reuses it), and no other starts."""
    import threading

    completer = make(models)
    runner = completer.backend.engine.target
    original = runner.forward
    cancel = threading.Event()
    sizes: list[int] = []

    def counting(tokens, **kwargs):
        sizes.append(len(tokens))
        if len(sizes) == 2:
            cancel.set()  # a request arrives during the second forward
        return original(tokens, **kwargs)

    runner.forward = counting
    text = FILE * 6 + "value = f_"
    line = text.count("\n")
    computed = completer.warm(request(text, line, len("value = f_")), cancel)
    assert sizes == [128, 128] and computed == 256
    assert len(runner.tokens) == 256  # both chunks, a valid prefix for the request


def test_a_request_computes_in_the_slot_it_names_and_leaves_the_documents_cache(models):
    """Prefetch computes a text the user may never type in a slot of its own: the document's
    caches keep what was typed."""
    completer = make(models)
    typed = completer.complete(request())
    kept = list(completer.backend.engine.target.tokens)
    assert completer.backend.engine.target.slot == URI and kept
    ahead = CompletionRequest(URI, TEXT + typed.text + "\n", 5, 0, "python", slot=URI + "#ahead")
    completer.complete(ahead)
    assert completer.backend.engine.target.slot == URI + "#ahead"
    completer.backend.engine.select_slot(URI)
    assert completer.backend.engine.target.tokens == kept


def test_alternatives_fork_the_last_answer_at_its_place_only(models):
    completer = make(models, languages={"python": {"multiline": "always"}})
    asked = request()
    first = completer.complete(asked)
    assert first.text and 0 < first.confidence <= 1
    assert completer.has_answered(asked)
    others = completer.alternatives(asked, 3)
    assert others, "random tiny models are unsure: there is somewhere to branch"
    texts = [first.text] + [other.text for other in others]
    assert len(set(texts)) == len(texts)  # none reads like another
    for other in others:
        assert other.stats.prefill_tokens == 0 and other.text.strip()
        assert other.confidence is not None
    assert [o.confidence for o in others] == sorted((o.confidence for o in others), reverse=True)
    # Another place (or text) has no answer to fork.
    elsewhere = request(line=1, character=4)
    assert not completer.has_answered(elsewhere) and completer.alternatives(elsewhere, 3) == []


def test_an_answer_unsure_under_the_floor_stops_early_and_shows_nothing(models):
    completer = make(models, languages={"python": {"multiline": "always"}})
    full = completer.complete(request())
    assert full.text and len(full.tokens) > 2
    # A floor the first token alone reaches, but not the whole answer: writing stops where
    # its tokens fall under it, nothing is shown, and there is no answer to fork.
    floor = full.confidence**0.5
    asked = dataclasses.replace(request(), min_confidence=floor)
    unsure = completer.complete(asked)
    assert unsure.stop_reason == "unsure" and unsure.text == ""
    assert unsure.confidence is not None and unsure.confidence < floor
    assert 1 <= len(unsure.tokens) < len(full.tokens)
    assert unsure.tokens == full.tokens[: len(unsure.tokens)]
    assert unsure.stats.target_forwards < full.stats.target_forwards
    assert not completer.has_answered(asked) and completer.alternatives(asked, 3) == []


def test_a_text_with_lone_surrogates_is_the_same_place_for_its_alternatives(models):
    completer = make(models)
    asked = request(text="name = '\ud800'\nvalue = ", line=1, character=8)
    completer.complete(asked)
    assert completer.has_answered(asked)  # the request as sent, surrogate and all
