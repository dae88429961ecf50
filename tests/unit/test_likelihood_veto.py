"""The likelihood veto (issue #32): the target scores a rule's candidate before it is shown.

What the engine computes (`Engine.likelihoods`: the log-probabilities one forward over the
prompt and the continuation gives, the slot left holding the prompt), what the pipeline asks
(a fill-in-the-middle window, the changed lines as they are and as the candidate leaves them),
and how the answer follows from it: a vetoed candidate gives way to the next, at most
LIKELIHOOD_CHECKS are scored, a backend that cannot score keeps the rule's answer, a
cancelled request shows nothing."""

from __future__ import annotations

import threading

import pytest
import torch

from quickdraft.backends import edit_sources
from quickdraft.config import load_config
from quickdraft.context.edit_history import Hunk
from quickdraft.context.edit_rules import Candidate, TextEdit, latest_edit
from quickdraft.context.edit_vetoes import (
    LIKELIHOOD_CHECKS,
    LIKELIHOOD_DROP,
    NEAR_GAIN,
    UNSCORED_RULES,
    clearly_likely,
    likelihood_window,
    likely_enough,
    vet,
)
from quickdraft.generation import NextEditRequest
from quickdraft.next_edit import suggest

URI = "file:///w/a.py"
DROP = LIKELIHOOD_DROP["draft"]
"""The default scorer's (edits.likelihood_veto: draft)."""
# `b` renamed to `a` in the signature: the two uses of `b` below are the rename's candidates.
TEXT = "def f(a):\n    c = b + 1\n    return b + c\n\nx = f(1)\n"
HUNK = Hunk(URI, 0, 0, "def f(b):\n", "def f(a):\n")


@pytest.fixture(scope="module")
def completer():
    from quickdraft.testing import build_tiny_loaded_models, local_completer

    return local_completer(build_tiny_loaded_models(), load_config({}))


def request(text: str = TEXT) -> NextEditRequest:
    return NextEditRequest(URI, text, 0, 7, "python", hunks=[HUNK])


@pytest.mark.parametrize("model", ["target", "draft"])
def test_the_engine_scores_each_continuation_as_one_forward_over_the_whole_would(completer, model):
    engine = completer.backend.engine
    runner = engine.drafter.runner if model == "draft" else engine.target
    assert runner is not engine.target or model == "target"  # the tiny models have a draft
    prompt, first, second = [5, 9, 14, 3, 7], [11, 2, 8], [4]
    scored = engine.likelihoods(prompt, [first, second], slot="veto-test", model=model)
    assert runner.tokens == prompt  # the continuations are cropped away
    for continuation, got in zip((first, second), scored, strict=True):
        runner.select("veto-reference")
        runner.reset()
        logits = runner.forward(prompt + continuation).float()
        rows = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        want = rows[torch.arange(len(continuation)), continuation]
        assert torch.allclose(torch.tensor(got), want, atol=1e-4)
    cancel = threading.Event()
    cancel.set()
    assert engine.likelihoods(prompt, [first], slot="veto-test", cancel=cancel) is None


def test_the_window_is_the_changed_lines_the_lines_around_them_and_the_latest_edit():
    text = "".join(f"v{i} = {i}\n" for i in range(80))
    line = text.index("v50 = 50")
    # The latest edit is line 30 (20 lines above the candidate: the window reaches it).
    edit = latest_edit(URI, text, [Hunk(URI, text.index("v30"), 30, "v30 = 0\n", "v30 = 30\n")])
    candidate = Candidate("repeat", TextEdit(line + 6, line + 8, "51"), 0.6)
    window = likelihood_window(edit, candidate)
    assert (window.old, window.new) == ("v50 = 50\n", "v50 = 51\n")
    assert window.prefix.startswith("v18 = 18\n")  # 12 lines above the edit's line
    assert window.suffix == "".join(f"v{i} = {i}\n" for i in range(51, 63))
    # An edit further than REACH_LINES away is not reached for: 12 lines each side.
    far = latest_edit(URI, text, [Hunk(URI, text.index("v2 "), 2, "v2 = 0\n", "v2 = 2\n")])
    assert likelihood_window(far, candidate).prefix.startswith("v38 = 38\n")


def test_the_quick_look_reads_a_few_lines_and_the_latest_edit_across_the_gap():
    text = "".join(f"v{i} = {i}\n" for i in range(80))
    line = text.index("v50 = 50")
    candidate = Candidate("repeat", TextEdit(line + 6, line + 8, "51"), 0.6)
    above = latest_edit(URI, text, [Hunk(URI, text.index("v30"), 30, "v30 = 0\n", "v30 = 30\n")])
    window = likelihood_window(above, candidate, near=True)
    assert (window.old, window.new) == ("v50 = 50\n", "v50 = 51\n")
    assert window.prefix == "v30 = 30\n" + "".join(f"v{i} = {i}\n" for i in range(47, 50))
    assert window.suffix == "".join(f"v{i} = {i}\n" for i in range(51, 54))
    below = latest_edit(URI, text, [Hunk(URI, text.index("v70"), 70, "v70 = 0\n", "v70 = 70\n")])
    window = likelihood_window(below, candidate, near=True)
    assert window.prefix == "".join(f"v{i} = {i}\n" for i in range(47, 50))
    assert window.suffix == "".join(f"v{i} = {i}\n" for i in range(51, 54)) + "v70 = 70\n"
    # An edit inside the window is read where it stands.
    near = latest_edit(URI, text, [Hunk(URI, text.index("v48"), 48, "v48 = 0\n", "v48 = 48\n")])
    assert likelihood_window(near, candidate, near=True).prefix.startswith("v47 = 47\n")


GAIN = NEAR_GAIN["draft"]


@pytest.mark.parametrize(
    "quick_gain, full_gain, kept",
    [
        (GAIN, -2 * DROP, True),  # clearly likely at a glance: kept after one look
        (GAIN - 1, -2 * DROP, False),  # not clearly: the full window vetoes it
        (GAIN - 1, 0.0, True),  # ... or keeps it
        (-DROP - 0.5, 0.0, False),  # a loss the full window vetoes: vetoed after one look
    ],
)
def test_the_quick_look_keeps_what_is_clearly_likely_vetoes_a_loss_and_asks_the_full_window(
    completer, monkeypatch, quick_gain, full_gain, kept
):
    text = "def f(a):\n" + "".join(f"    y{i} = {i}\n" for i in range(30)) + "    return b\n"
    at = text.index("return b") + len("return ")
    asked = []

    def likelihoods(prompt_ids, continuations, *, slot, model, cancel, deadline):
        asked.append(completer.tokenizer.decode(prompt_ids))
        old, new = continuations
        change = quick_gain if len(asked) == 1 else full_gain
        return [[-5.0] * len(old), [-5.0 + change] + [-5.0] * (len(new) - 1)]

    monkeypatch.setattr(completer.backend.engine, "likelihoods", likelihoods)
    monkeypatch.setattr(completer.backend.engine, "generate", None)
    result = suggest(edit_sources(completer), request(text))
    assert (result.rule == "rename") is kept and result.judged == 1
    assert len(asked) == (1 if quick_gain >= GAIN or quick_gain < -DROP else 2)
    if kept:
        assert [(e.start, e.end, e.text) for e in result.edits] == [(at, at + 1, "a")]
    # The quick look: the edit's line across the gap, then the 3 lines above the candidate;
    # the full window reaches up to the edit.
    assert asked[0].startswith("<|fim_prefix|>def f(a):\n    y27 = 27\n")
    assert "y26" not in asked[0]
    if len(asked) == 2:
        assert "y1 = 1\n" in asked[1] and "y26 = 26\n" in asked[1]


def test_the_shared_start_of_the_middles_leaves_the_change_in_likelihood_as_it_was(completer):
    engine = completer.backend.engine
    prompt, old, new = [5, 9, 14, 3], [7, 7, 11, 2, 8], [7, 7, 4, 8]
    whole = engine.likelihoods(prompt, [old, new], slot="veto-test", model="draft")
    split = engine.likelihoods(
        prompt + old[:2], [old[2:], new[2:]], slot="veto-test", model="draft"
    )
    assert abs((sum(whole[1]) - sum(whole[0])) - (sum(split[1]) - sum(split[0]))) < 1e-4


def test_a_candidate_that_makes_its_lines_much_less_likely_is_vetoed():
    assert likely_enough([-1.0, -1.0], [-0.5, -0.5])  # more likely
    assert likely_enough([-1.0, -1.0], [-1.0 - DROP / 2, -1.0])
    assert likely_enough([-1.0], [-1.0 - DROP])
    assert clearly_likely([-9.0], [-9.0 + NEAR_GAIN["draft"]])
    assert not clearly_likely([-9.0], [-9.1 + NEAR_GAIN["draft"]])
    assert not clearly_likely([-9.0], [0.0], model="target")  # no quick look: the full window
    assert not likely_enough([-1.0], [-1.1 - DROP])
    assert not likely_enough([-1.0], [-1.1 - LIKELIHOOD_DROP["target"]], model="target")


@pytest.mark.parametrize("first_drop", [0.0, 2 * DROP])
def test_the_pipeline_asks_the_model_about_the_best_candidate_and_shows_it_if_kept(
    completer, monkeypatch, first_drop
):
    engine = completer.backend.engine
    asked = []

    def likelihoods(prompt_ids, continuations, *, slot, model, cancel, deadline):
        assert model == "draft"  # the default scorer
        asked.append((completer.tokenizer.decode(prompt_ids), continuations, slot))
        old, new = continuations
        # The first candidate (the nearer use) loses `first_drop`; any later one nothing.
        drop = first_drop if len(asked) == 1 else 0.0
        return [[-1.0] * len(old), [-1.0 - drop] + [-1.0] * (len(new) - 1)]

    monkeypatch.setattr(engine, "likelihoods", likelihoods)
    monkeypatch.setattr(engine, "generate", None)  # no rewrite is asked
    result = suggest(edit_sources(completer), request())
    if first_drop > DROP:  # vetoed: after LIKELIHOOD_CHECKS vetoes the answer is no edit
        assert len(asked) == result.judged == LIKELIHOOD_CHECKS
        assert result.vetoed == {"likelihood": 1} and (result.rule is None) is (
            LIKELIHOOD_CHECKS == 1
        )
    else:
        assert len(asked) == 1 and result.judged == 1 and result.vetoed == {}
        at = TEXT.index("c = b") + len("c = ")
        assert [(e.start, e.end, e.text) for e in result.edits] == [(at, at + 1, "a")]
        assert result.rule == "rename"
    prompt, (old, new), slot = asked[0]
    assert slot == URI + "#edit"  # the document's completion cache is left be
    # The file is short: the quick look's window is the whole window, scored once.
    assert prompt.startswith("<|fim_prefix|>")
    assert "def f(a):\n" in prompt and "return b + c\n" in prompt  # the window, both sides
    # The middles' shared first tokens close the prompt; what follows them is scored twice.
    assert prompt.endswith("<|fim_middle|>    c = ")
    decode = completer.tokenizer.decode
    assert decode(old) == "b + 1\n<|endoftext|>"
    assert decode(new) == "a + 1\n<|endoftext|>"
    assert list(result.stages) == ["rules_ms", "veto_ms"]


def test_at_most_a_few_candidates_are_scored_then_the_answer_is_no_edit():
    text = "def f(a):\n" + "".join(f"    y{i} = b\n" for i in range(8))
    edit = latest_edit(URI, text, [HUNK], "python")
    candidates = [
        Candidate(
            "rename", TextEdit(text.index(f"y{i} = b") + 5, text.index(f"y{i} = b") + 6, "a"), 0.9
        )
        for i in range(8)
    ]
    judged = []
    decision = vet(edit, candidates, judge=lambda c: judged.append(c) or False)
    assert decision.shown is None and len(judged) == LIKELIHOOD_CHECKS
    assert decision.vetoed == {"likelihood": LIKELIHOOD_CHECKS}
    # A backend that cannot score (None) keeps the rule's answer; a cancelled one shows none.
    kept = vet(edit, candidates, judge=lambda c: None)
    assert kept.shown is candidates[0] and kept.unscored == 1
    stopped = vet(edit, candidates, judge=lambda c: None, cancelled=lambda: True)
    assert stopped.shown is None and stopped.judged == 1


def test_the_rules_the_veto_never_corrected_are_not_scored():
    text = "def f(a):\n    import os\n    y = b\n"
    edit = latest_edit(URI, text, [HUNK], "python")
    at = text.index("y = b") + 4
    moved = text.index("    import os")
    hoist = Candidate("hoist", TextEdit(moved, moved + len("    import os\n"), ""), 0.9)
    rename = Candidate("rename", TextEdit(at, at + 1, "a"), 0.9)
    judged = []
    decision = vet(edit, [hoist, rename], judge=lambda c: judged.append(c) or False)
    assert "hoist" in UNSCORED_RULES and decision.shown is hoist and judged == []
    decision = vet(edit, [rename, hoist], judge=lambda c: judged.append(c) or False)
    assert judged == [rename] and decision.judged == 1
    # After LIKELIHOOD_CHECKS vetoes the search ends: an unscored candidate after them is not
    # shown either.
    assert (decision.shown is hoist) is (LIKELIHOOD_CHECKS > 1)
    decision = vet(edit, [rename] * LIKELIHOOD_CHECKS + [hoist], judge=lambda c: False)
    assert decision.shown is None and decision.judged == LIKELIHOOD_CHECKS


def test_a_serving_engine_is_not_asked_and_the_rule_answers(completer, monkeypatch):
    monkeypatch.setattr(completer.backend, "likelihoods", lambda *a, **k: None)
    monkeypatch.setattr(completer.backend.engine, "generate", None)
    result = suggest(edit_sources(completer), request())
    assert result.rule == "rename" and result.judged == 0 and result.vetoed == {}


def test_a_cancelled_request_ends_the_search_with_no_edit(completer):
    cancel = threading.Event()
    cancel.set()
    result = suggest(edit_sources(completer), request(), cancel=cancel)
    assert result.edits == [] and result.rule is None


def test_a_window_too_long_to_score_keeps_the_rules_answer(completer, monkeypatch):
    monkeypatch.setattr(completer.backend.engine, "likelihoods", None)  # never called
    monkeypatch.setattr(completer.backend.engine, "generate", None)
    text = TEXT.replace("    c = b + 1\n", "    c = b + 1  # " + "x " * 3000 + "\n")
    result = suggest(edit_sources(completer), request(text))
    assert result.rule == "rename" and result.judged == 0 and result.vetoed == {}


def test_a_question_asked_again_is_answered_without_computing_it_again(completer, monkeypatch):
    """A next edit decided ahead and then asked for asks the same question twice: the second
    is answered as the first was (the latest few are kept; a cold start forgets them)."""
    engine = completer.backend.engine
    runner = engine.drafter.runner
    forwards = []
    forward = runner.forward
    monkeypatch.setattr(
        runner, "forward", lambda tokens, **kw: forwards.append(1) or forward(tokens, **kw)
    )
    prompt, old, new = [5, 9, 14, 3, 6, 2], [7, 11, 2], [7, 4]
    first = engine.likelihoods(prompt, [old, new], slot="memo-test", model="draft")
    computed = len(forwards)
    assert computed > 0
    assert engine.likelihoods(prompt, [old, new], slot="memo-test", model="draft") == first
    assert len(forwards) == computed  # nothing computed the second time
    engine.likelihoods(prompt, [old, new], slot="memo-test", model="target")  # another model
    engine.reset_cache()
    forwards.clear()
    again = engine.likelihoods(prompt, [old, new], slot="memo-test", model="draft")
    assert [x for row in again for x in row] == pytest.approx([x for row in first for x in row])
    assert forwards  # computed again after a cold start


def test_a_head_computed_ahead_in_one_slot_is_adopted_by_a_window_in_another(completer):
    engine = completer.backend.engine
    runner = engine.drafter.runner
    head = [(7 * i) % 50 + 3 for i in range(40)]
    assert engine.prefill(head, slot="head-test", model="draft") == len(head)
    assert engine.prefill(head, slot="head-test", model="draft") == 0  # already there
    engine.likelihoods(head + [9, 4, 4], [[5, 6], [8]], slot="window-test", model="draft")
    assert runner.last_adopted == len(head)  # the window computed only what follows the head
    # The target computes nothing for the draft's questions: it keeps no slot for them.
    assert not {"head-test", "window-test"} & set(engine.target.slots)


ABOVE = "".join(f"    y{i} = {i}\n" for i in range(20))
RESTING = "def f(a):\n" + ABOVE + "    b = 1\n    return b\n"
"""A file whose line 21 (`b = 1`) the person rests on, then renames `b` there."""


def test_a_cursor_resting_away_from_the_latest_edit_computes_the_head_of_the_windows_below(
    completer, monkeypatch
):
    sources = edit_sources(completer)
    heads, windows = [], []

    def prefill(prompt_ids, *, slot, model, cancel):
        heads.append((list(prompt_ids), slot, model))
        return len(prompt_ids)

    def likelihoods(prompt_ids, continuations, *, slot, model, cancel, deadline):
        windows.append(list(prompt_ids))
        return [[-5.0] * len(c) for c in continuations]  # no gain: the full window decides

    monkeypatch.setattr(completer.backend, "prefill", prefill)
    monkeypatch.setattr(completer.backend.engine, "likelihoods", likelihoods)
    monkeypatch.setattr(completer.backend.engine, "generate", None)
    line = RESTING.count("\n", 0, RESTING.index("    b = 1"))
    rested = suggest(sources, NextEditRequest(URI, RESTING, line, 4, "python", hunks=[]))
    assert rested.edits == [] and rested.head_tokens > 0 and "head_ms" in rested.stages
    [(head, slot, model)] = heads
    assert slot == URI + "#edit-head" and model == "draft"
    assert completer.tokenizer.decode(head).startswith("<|fim_prefix|>    y8 = 8\n")
    assert completer.tokenizer.decode(head).endswith("    y19 = 19\n")  # the 12 lines above
    # The person renames `b` on that line: the window of its use below opens with the head.
    at = RESTING.index("    b = 1") + 4
    text = RESTING[:at] + "c" + RESTING[at + 1 :]
    start = RESTING.index("    b = 1")
    hunk = Hunk(URI, start, line, "    b = 1\n", "    c = 1\n")
    renamed = suggest(sources, NextEditRequest(URI, text, line, 5, "python", hunks=[hunk]))
    assert renamed.rule == "rename" and renamed.head_tokens == 0 and len(heads) == 1
    full = windows[-1]
    assert full[: len(head) - 1] == head[:-1]  # the head's tokens, but where lines join
