"""An added parameter's argument written by the model (issue #32, `signature`).

A parameter added without a default breaks every call that does not pass it. Where the calling
function has a same-named variable the rule passes it; elsewhere the rule holds the argument
open (`Candidate.fill_at`) and the pipeline has the target write it: a short fill-in-the-middle
at the call (at most FILL_TOKENS tokens), stopped once the argument ends, then vetoed like any
rule's edit. Tests count what was asked and what was shown; none times anything."""

from __future__ import annotations

import pytest

from quickdraft.backends import edit_sources
from quickdraft.config import load_config
from quickdraft.context.edit_history import Hunk
from quickdraft.context.edit_rules import argument_written, latest_edit, signature_candidates
from quickdraft.context.edit_vetoes import (
    FILL_CHECKS,
    FILL_LOGPROB,
    FILL_TOKENS,
    fill_window,
    vet,
)
from quickdraft.decoding import GenerationResult, GenerationStats
from quickdraft.decoding.confidence import TokenChoice
from quickdraft.generation import NextEditRequest
from quickdraft.next_edit import suggest

URI = "file:///w/fetch.py"
BEFORE = (
    "import time\n"
    "\n"
    "\n"
    "def fetch(url):\n"
    "    return url.upper()\n"
    "\n"
    "\n"
    "def main():\n"
    "    first = fetch('a')\n"
    "    second = fetch('b')\n"
    "    return first + second\n"
)
AFTER = BEFORE.replace("def fetch(url):", "def fetch(url, timeout):")
AT = BEFORE.index("def fetch")
HUNK = Hunk(URI, AT, 3, "def fetch(url):\n", "def fetch(url, timeout):\n")


def request(text: str = AFTER) -> NextEditRequest:
    return NextEditRequest(URI, text, 3, 23, "python", hunks=[HUNK])


def test_a_call_with_no_same_named_variable_holds_the_argument_open_for_the_model():
    edit = latest_edit(URI, AFTER, [HUNK], "python")
    candidates = signature_candidates(edit)
    assert [(c.edit.text, c.fill_at) for c in candidates] == [(", ", 2), (", ", 2)]
    first = AFTER.index("fetch('a')") + len("fetch('a'")
    assert (candidates[0].edit.start, candidates[0].edit.end) == (first, first)
    # A same-named variable in the calling function is passed: nothing is left to the model.
    named = AFTER.replace("    first = fetch('a')", "    timeout = 3\n    first = fetch('a')")
    edit = latest_edit(URI, named, [HUNK], "python")
    assert [(c.edit.text, c.fill_at) for c in signature_candidates(edit)] == [
        (", timeout", None),
        (", timeout", None),
    ]
    # A parameter inserted before others: the argument and its comma go before theirs.
    middle = BEFORE.replace("def fetch(url):", "def fetch(timeout, url):")
    hunk = Hunk(URI, AT, 3, "def fetch(url):\n", "def fetch(timeout, url):\n")
    edit = latest_edit(URI, middle, [hunk], "python")
    assert [(c.edit.text, c.fill_at) for c in signature_candidates(edit)][0] == (", ", 0)
    # With a default the calls need no change: no candidate at all.
    default = BEFORE.replace("def fetch(url):", "def fetch(url, timeout=3):")
    hunk = Hunk(URI, AT, 3, "def fetch(url):\n", "def fetch(url, timeout=3):\n")
    assert signature_candidates(latest_edit(URI, default, [hunk], "python")) == []


@pytest.mark.parametrize(
    "written, argument, ended",
    [
        ("timeout=30)", "timeout=30", True),
        ("30, retries=2)", "30", True),
        ("f(a, b), 3)", "f(a, b)", True),
        ("'a,b')", "'a,b'", True),
        ('"x\\")" )', '"x\\")" ', True),
        ("[1, 2]\n", "[1, 2]", True),
        ("3\n    second", "3", True),
        ("config.get(", "config.get(", False),  # not ended: the model may go on
        ("'open", "'open", False),
        ("x" * 100, "x" * 80, True),  # too long: ended, for the caller to refuse
    ],
)
def test_the_argument_a_model_wrote_ends_at_its_comma_or_bracket(written, argument, ended):
    assert argument_written(written) == (argument, ended)


def test_the_model_reads_the_call_open_at_the_argument_and_the_def_above_it():
    far = AFTER.replace("def main():\n", "def main():\n" + "    pass\n" * 60)
    edit = latest_edit(URI, far, [HUNK], "python")
    candidate = signature_candidates(edit)[0]
    prefix, suffix = fill_window(edit, candidate)
    assert prefix.endswith("    first = fetch('a', ")
    assert suffix.startswith(")\n    second = fetch('b')\n")
    # The def is 60 lines up, beyond the window's reach: its line is put across the gap.
    assert prefix.startswith("def fetch(url, timeout):\n")
    assert prefix.count("pass") == 12


def test_without_a_model_a_held_open_candidate_is_not_shown():
    edit = latest_edit(URI, AFTER, [HUNK], "python")
    decision = vet(edit, signature_candidates(edit))
    assert decision.shown is None and decision.vetoed == {"fill": 2}
    asked = []

    def fill(candidate):
        asked.append(candidate)
        return None  # the model wrote no argument

    decision = vet(edit, signature_candidates(edit), filler=fill)
    assert len(asked) == FILL_CHECKS == decision.filled  # one generation per request
    assert decision.shown is None and decision.vetoed == {"fill": 2}


@pytest.fixture(scope="module")
def completer():
    from quickdraft.testing import build_tiny_loaded_models, local_completer

    return local_completer(build_tiny_loaded_models(), load_config({}))


def sure(tokens: list[int], logprob: float) -> list[TokenChoice]:
    """The target's view of each token it wrote: each this likely."""
    return [TokenChoice(logprob, 0, -9.0) for _ in tokens]


@pytest.mark.parametrize("logprob", [-0.1, -2.0])
def test_the_pipeline_has_the_target_write_the_argument_and_shows_the_call_with_it(
    completer, monkeypatch, logprob
):
    engine = completer.backend.engine
    tokenizer = completer.tokenizer
    asked = []

    def generate(generation):
        asked.append(generation)
        written = tokenizer.encode("timeout=30)\n", add_special_tokens=False)
        tokens = []
        for token in written:  # as the engine does: it stops where the rule says so
            tokens.append(token)
            if generation.stop(tokens):
                break
        return GenerationResult(tokens, "stop", GenerationStats(), sure(tokens, logprob))

    monkeypatch.setattr(engine, "generate", generate)
    monkeypatch.setattr(engine, "likelihoods", None)  # a written argument is not rescored
    result = suggest(edit_sources(completer), request())
    assert len(asked) == 1
    if count_of(tokenizer, "timeout=30") * logprob < FILL_LOGPROB:
        # The target was unsure of what it wrote: no edit, the nearest call asked alone.
        assert result.edits == [] and result.vetoed == {"fill": 2} and result.filled == 1
        return
    generation = asked[0]
    assert generation.max_new_tokens == FILL_TOKENS
    assert generation.slot == URI + "#edit"  # the document's completion cache is left be
    assert generation.temperature == 0.0
    prompt = tokenizer.decode(generation.prompt_ids)
    assert "def fetch(url, timeout):\n" in prompt
    assert "    first = fetch('a', <|fim_suffix|>)\n    second" in prompt
    at = AFTER.index("fetch('a')") + len("fetch('a'")
    assert result.vetoed == {} and result.judged == 0  # its own certainty judged it
    assert [(e.start, e.end, e.text) for e in result.edits] == [(at, at, ", timeout=30")]
    assert result.rule == "signature"


def count_of(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize(
    "written, reason", [("\n", "stop"), ("config.get(", "max_tokens"), (")", "stop")]
)
def test_a_text_that_is_no_argument_fills_nothing(completer, monkeypatch, written, reason):
    engine = completer.backend.engine
    tokens = completer.tokenizer.encode(written, add_special_tokens=False)
    monkeypatch.setattr(
        engine,
        "generate",
        lambda g: GenerationResult(tokens, reason, GenerationStats(), sure(tokens, 0.0)),
    )
    monkeypatch.setattr(engine, "likelihoods", None)  # nothing is left to score
    result = suggest(edit_sources(completer), request())
    assert result.edits == [] and result.vetoed == {"fill": 2}


def test_a_middle_the_model_ended_is_the_whole_argument(completer, monkeypatch):
    """A fill-in-the-middle model ends the middle (its end token) right after the argument:
    no comma or bracket follows it, and it is whole."""
    engine = completer.backend.engine
    tokens = completer.tokenizer.encode("timeout", add_special_tokens=False)
    monkeypatch.setattr(
        engine,
        "generate",
        lambda g: GenerationResult(tokens, "eos", GenerationStats(), sure(tokens, 0.0)),
    )
    monkeypatch.setattr(engine, "likelihoods", None)
    result = suggest(edit_sources(completer), request())
    at = AFTER.index("fetch('a')") + len("fetch('a'")
    assert [(e.start, e.end, e.text) for e in result.edits] == [(at, at, ", timeout")]


def test_a_same_named_variable_is_passed_without_asking_the_model(completer, monkeypatch):
    """The call is broken without the argument, and the variable's tokens would cost the line
    nats however right it is: the likelihood veto is not asked."""
    engine = completer.backend.engine
    monkeypatch.setattr(engine, "generate", None)
    monkeypatch.setattr(engine, "likelihoods", None)
    named = AFTER.replace("    first = fetch('a')", "    timeout = 3\n    first = fetch('a')")
    result = suggest(edit_sources(completer), request(named))
    at = named.index("fetch('a')") + len("fetch('a'")
    assert [(e.start, e.end, e.text) for e in result.edits] == [(at, at, ", timeout")]
    assert result.judged == 0 and result.filled == 0


def test_a_window_of_very_long_lines_is_not_read(completer, monkeypatch):
    engine = completer.backend.engine
    monkeypatch.setattr(engine, "generate", None)  # never asked
    long = AFTER.replace(
        "    return first + second\n", f"    return first + second  # {'x' * 40000}\n"
    )
    result = suggest(edit_sources(completer), request(long))
    assert result.edits == [] and result.vetoed == {"fill": 2} and result.filled == 1


def test_the_setting_off_asks_no_model(completer, monkeypatch):
    engine = completer.backend.engine
    monkeypatch.setattr(engine, "generate", None)
    sources = edit_sources(completer)
    config = load_config({"edits": {"fill_arguments": False}})
    result = suggest(sources.__class__(**{**sources.__dict__, "config": config}), request())
    assert result.edits == [] and result.vetoed == {"fill": 2}


def test_the_tiny_target_writes_at_most_the_fill_budget(completer, monkeypatch):
    """The real engine, no stand-in: however the tiny random model writes, one generation of
    at most FILL_TOKENS tokens, in the next-edit slot."""
    engine = completer.backend.engine
    generate, ran = engine.generate, []

    def counted(generation):
        result = generate(generation)
        ran.append((generation, result))
        return result

    monkeypatch.setattr(engine, "generate", counted)
    result = suggest(edit_sources(completer), request())
    assert result.filled == 1 and len(ran) == 1
    generation, written = ran[0]
    assert generation.slot == URI + "#edit"
    assert len(written.tokens) <= FILL_TOKENS
    assert written.stats.target_forwards <= FILL_TOKENS


def candidates_for(before: str, old: str, new: str) -> list:
    after = before.replace(old, new)
    at = before.index(old)
    line = before[:at].count("\n")
    start = at - (at - before.rfind("\n", 0, at) - 1)  # a hunk holds whole lines
    end = before.index("\n", at) + 1
    hunk = Hunk(URI, start, line, before[start:end], after[start : end + len(new) - len(old)])
    return signature_candidates(latest_edit(URI, after, [hunk], "python"))


METHOD = (
    "class Client:\n"
    "    def fetch(self, url, retries):\n"
    "        return url\n"
    "\n"
    "    def main(self):\n"
    "        return self.fetch('a', 3)\n"
)


def test_a_method_whose_header_line_is_the_hunk_is_a_signature_change():
    """The document store's hunks hold whole lines: a method's starts at its indentation,
    where the class body, not the def, covers it (no method's calls were ever fitted)."""
    dropped = candidates_for(METHOD, "url, retries)", "url)")
    after = METHOD.replace("url, retries)", "url)")
    at = after.index("'a', 3") + len("'a'")
    assert [(c.edit.start, c.edit.end, c.edit.text) for c in dropped] == [(at, at + 3, "")]
    assert dropped[0].scored  # a dropped argument is scored as before
    added = candidates_for(METHOD, "url, retries)", "url, retries, timeout)")
    assert [(c.edit.text, c.fill_at, c.scored) for c in added] == [(", ", 2, False)]


def test_star_parameters_and_keyword_only_ones_are_passed_as_calls_take_them():
    text = "def f(a, *, b):\n    return a\n\n\ndef g(b):\n    return f(1, b=b)\n"
    # A keyword-only parameter dropped: by its keyword, never by position.
    dropped = candidates_for(text, "def f(a, *, b):", "def f(a):")
    assert [c.edit.text for c in dropped] == [""]
    after = text.replace("def f(a, *, b):", "def f(a):")
    assert after[dropped[0].edit.start : dropped[0].edit.end] == ", b=b"
    keyword = text.replace("f(1, b=b)", "f(1, 2)")
    assert candidates_for(keyword, "def f(a, *, b):", "def f(a):") == []
    # A keyword-only parameter added: `name=` after the call's arguments.
    plain = "def f(a):\n    return a\n\n\ndef g(c):\n    return f(1)\n"
    added = candidates_for(plain, "def f(a):", "def f(a, *, c):")
    assert [(c.edit.text, c.fill_at) for c in added] == [(", c=c", None)]
    held = candidates_for(plain, "def f(a):", "def f(a, *, d):")
    assert [(c.edit.text, c.fill_at) for c in held] == [(", d=", 4)]
    # `*args` and `**kwargs`, added or dropped: which arguments they take cannot be told.
    star = "def f(a, *args):\n    return a\n\n\ndef g(args):\n    return f(1, 2, 3)\n"
    assert candidates_for(star, "def f(a, *args):", "def f(a):") == []
    assert candidates_for(plain, "def f(a):", "def f(a, **kwargs):") == []
