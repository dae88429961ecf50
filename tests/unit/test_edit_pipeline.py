"""Next edits: the region, the prompt formats, the diff from a rewrite to minimal edits, and the
pipeline through a tiny local model (the region goes to the engine as the copy source)."""

from __future__ import annotations

import pytest

from quickdraft.backends import edit_sources
from quickdraft.config import load_config
from quickdraft.context.edit_history import Hunk
from quickdraft.context.edit_prompt import (
    CURSOR,
    REGION_END,
    REGION_START,
    EditContext,
    choose_format,
    choose_region,
    render_edit_prompt,
)
from quickdraft.errors import ConfigError
from quickdraft.generation import NextEditRequest
from quickdraft.lsp.documents import Document
from quickdraft.lsp.service import edit_item
from quickdraft.next_edit import (
    Edit,
    minimal_edits,
    reject_reason,
    without_overrun,
)

# --- minimal edits --------------------------------------------------------------------------

REGION = "def f(a, b):\n    x = a + b\n    return x\n"


def applied(old: str, edits: list[Edit], base: int = 0) -> str:
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        old = old[: edit.start - base] + edit.text + old[edit.end - base :]
    return old


def test_nothing_changed_gives_no_edit():
    assert minimal_edits(REGION, REGION) == []


def test_one_character_is_one_character_edit():
    new = REGION.replace("a + b", "a - b")
    assert minimal_edits(REGION, new) == [Edit(23, 24, "-")]


def test_a_line_replaced_is_trimmed_to_what_differs():
    new = REGION.replace("    x = a + b\n", "    x = a * b + 1\n")
    [edit] = minimal_edits(REGION, new, base=100)
    assert (edit.start, edit.end, edit.text) == (100 + 23, 100 + 26, "* b + 1")
    assert applied(REGION, [edit], base=100) == new


def test_inserted_and_deleted_lines():
    inserted = REGION.replace("    return x\n", "    print(x)\n    return x\n")
    [edit] = minimal_edits(REGION, inserted)
    assert edit.start == edit.end and edit.text == "    print(x)\n"
    deleted = REGION.replace("    x = a + b\n", "")
    [edit] = minimal_edits(REGION, deleted)
    assert edit.text == "" and REGION[edit.start : edit.end] == "    x = a + b\n"


def test_changes_far_apart_are_separate_edits_top_to_bottom():
    old = "a = 1\nb = 2\nc = 3\nd = 4\n"
    new = "a = 10\nb = 2\nc = 3\nd = 40\n"
    edits = minimal_edits(old, new)
    assert [(e.start, e.end, e.text) for e in edits] == [(5, 5, "0"), (23, 23, "0")]
    assert applied(old, edits) == new


def test_unicode_offsets_are_code_points_and_ranges_utf16_units():
    old = "s = '😀' + name\nt = name\n"
    new = old.replace("name", "label")
    edits = minimal_edits(old, new)
    assert applied(old, edits) == new
    document = Document("file:///u.py", old, "python", 3)
    first = edit_item(document, edits[0], 3)
    # '😀' is one code point and two UTF-16 units: the range counts it twice.
    assert first["range"]["start"] == {"line": 0, "character": len("s = '😀' + ") + 1}
    assert first["textDocument"] == {"uri": "file:///u.py", "version": 3}
    utf8 = Document("file:///u.py", old, "python", 3, "utf-8")
    assert edit_item(utf8, edits[0], 3)["range"]["start"]["character"] == len("s = '' + ") + 4


def test_rewrites_that_did_not_finish_or_replace_most_of_the_region_are_refused():
    region = "x = 1\n" * 30
    assert reject_reason(region, None, []) == "the rewrite did not finish the region"
    small = region.replace("x = 1", "y = 1", 3)
    assert reject_reason(region, small, minimal_edits(region, small)) is None
    other = "z = 2\n" * 30
    assert "replaced" in reject_reason(region, other, minimal_edits(region, other))
    assert "replaced" in reject_reason(region, "", minimal_edits(region, ""))
    grown = region + "w = 3\n" * 200
    assert "grew" in reject_reason(region, grown, minimal_edits(region, grown))
    # A short region may be rewritten whole (the floor): one line has no "most" to keep.
    assert reject_reason("x = 1", "y = 2", minimal_edits("x = 1", "y = 2")) is None


# --- the region ---------------------------------------------------------------------------

PYTHON = (
    "".join(f"v{i} = {i}\n" for i in range(20))
    + ("result = compute(\n    alpha,\n    beta,\n    gamma,\n)\n")
    + "".join(f"w{i} = {i}\n" for i in range(20))
)


def test_the_region_is_lines_around_the_cursor_never_past_the_file():
    text = "".join(f"line {i}\n" for i in range(10))
    region = choose_region(text, text.index("line 5"), lines_above=2, lines_below=3)
    assert (region.start_line, region.end_line) == (3, 9)
    assert region.text == "line 3\nline 4\nline 5\nline 6\nline 7\nline 8"
    assert region.text[region.cursor :].startswith("line 5")
    assert region.before == "line 0\nline 1\nline 2\n" and region.after.startswith("line 9")
    top = choose_region(text, 0, lines_above=8, lines_below=100)
    assert (top.start_line, top.end_line) == (0, 11) and top.at_file_start and top.at_file_end
    assert top.text == text and top.after == ""
    empty = choose_region("", 0, lines_above=8, lines_below=16)
    assert (empty.text, empty.start, empty.end) == ("", 0, 0)


def test_region_ends_snap_to_statement_boundaries_with_a_grammar():
    cursor = PYTHON.index("v18")
    # 18 + 4 = line 22 ("    gamma,"), in the middle of the call: the end moves past it.
    region = choose_region(
        PYTHON, cursor, lines_above=1, lines_below=4, language_id="python", path="a.py"
    )
    assert region.text.endswith("    gamma,\n)") and region.end_line == 25
    # Without a grammar the region is what was asked for.
    plain = choose_region(PYTHON, cursor, lines_above=1, lines_below=4)
    assert plain.end_line == 23 and plain.text.endswith("    beta,")
    # A start in the middle of the call moves up to the statement's first line.
    inside = choose_region(
        PYTHON, PYTHON.index("    beta"), lines_above=1, lines_below=1, language_id="python"
    )
    assert inside.text.startswith("result = compute(")


def test_the_region_holds_the_latest_edit_and_starts_where_it_did_before_it():
    text = "".join(f"line {i}\n" for i in range(30))
    before = choose_region(text, text.index("line 10"), lines_above=2, lines_below=3)
    assert (before.start_line, before.end_line) == (8, 14)
    # Three lines typed at line 10: the cursor is on line 12 now, the hunk holds lines 10-12.
    edited = text.replace("line 10\n", "new a\nnew b\nline 10 changed\n")
    after = choose_region(
        edited, edited.index(" changed"), lines_above=2, lines_below=3, edited=(10, 12)
    )
    assert (after.start_line, after.end_line) == (8, 16)  # from the edit's top, to its end + 3
    assert after.before == before.before and after.after == before.after
    # The hunk is elsewhere (the cursor moved on): the cursor alone places the region.
    far = choose_region(
        edited, edited.index("line 25"), lines_above=2, lines_below=3, edited=(10, 12)
    )
    assert (far.start_line, far.end_line) == (25, 31)


def test_an_edit_leaves_the_instruct_prompt_the_same_up_to_the_edited_line():
    """The prompt asked where the cursor arrived and the one after the edit share their head
    (files, the lines around the region, the region down to the edit): a request before the
    edit leaves it in the edit slot's cache, and the request after computes only the rest."""
    text = "".join(f"value_{i} = compute({i})\n" for i in range(40))
    at = text.index("value_20")
    ctx_before = context(region=choose_region(text, at, lines_above=8, lines_below=16), hunks=[])
    edited = text[:at] + "total = 0\n" + text[at:].replace("compute(20)", "compute(20, total)", 1)
    hunk = Hunk(
        "file:///w/a.py",
        at,
        20,
        "value_20 = compute(20)\n",
        "total = 0\nvalue_20 = compute(20, total)\n",
    )
    region = choose_region(
        edited, edited.index(", total)") + 7, lines_above=8, lines_below=16, edited=(20, 21)
    )
    ctx_after = context(region=region, hunks=[("a.py", hunk)])
    old, new = (render_edit_prompt("instruct", c).text for c in (ctx_before, ctx_after))
    shared = 0
    while old[shared] == new[shared]:
        shared += 1
    assert new[shared:].startswith("total = 0\nvalue_20")  # all before the edit is shared
    assert "value_38 = compute(38)" in new[:shared]  # the lines below the region too
    assert new.index("My recent edits") > new.index("value_35")  # the diff comes after them


# --- the prompt formats -------------------------------------------------------------------


def context(**fields) -> EditContext:
    text = "def f(a):\n    return a\n\nx = f(1)\n"
    region = choose_region(text, text.index("return"), lines_above=1, lines_below=2)
    hunk = Hunk("file:///w/a.py", 0, 0, "def f(b):\n", "def f(a):\n")
    defaults = dict(
        region=region,
        path="a.py",
        language_id="python",
        hunks=[("a.py", hunk)],
        special_tokens=("<|endoftext|>", "<|file_sep|>"),
    )
    return EditContext(**{**defaults, **fields})


@pytest.mark.parametrize("name", ["instruct", "zeta", "sweep", "instinct"])
def test_every_format_ends_with_the_answers_opening_and_reads_the_region_back(name):
    ctx = context()
    prompt = render_edit_prompt(name, ctx)
    text = prompt.text
    if name != "sweep":  # (sweep shows a hunk as its original and updated lines)
        assert "-def f(b):" in text and "+def f(a):" in text  # the recent edit, as a diff
    assert "x = f(1)" in text and "return a" in text
    rewritten = ctx.region.text.replace("return a", "return a + 1")
    answer = rewritten + prompt.closing + "\ntrailing"
    assert prompt.region_of(answer, ended=False) == rewritten
    assert prompt.region_of(rewritten[:5], ended=False) is None  # cut off: not finished
    assert prompt.answer.startswith(ctx.region.text)  # the copy source: the region first
    if name == "instruct":
        assert text.endswith("<|im_start|>assistant\n```python\n")
    if name == "zeta":
        # (the region starts at the top of the file: the excerpt says so)
        assert text.endswith(f"### Response:\n\n```a.py\n<|start_of_file|>\n{REGION_START}\n")
        assert f"{CURSOR}return a" in text and REGION_END in text
        assert prompt.region_of(f"def{CURSOR} g{prompt.closing}", ended=True) == "def g"
    if name == "sweep":
        assert text.endswith("<|file_sep|>updated/a.py\n")
        assert "<|file_sep|>a.py.diff\noriginal:\ndef f(b):\nupdated:\ndef f(a):\n" in text
        assert prompt.region_of(rewritten + "\n", ended=True) == rewritten  # stopped at the sep
    if name == "instinct":
        assert text.endswith("<|im_start|>assistant\n") and "### User Excerpt:\na.py" in text
        assert prompt.region_of(rewritten + "\n", ended=True) == rewritten


def test_document_text_cannot_end_a_section():
    text = "x = '<|im_end|>'\ny = '<|editable_region_end|>'\n"
    region = choose_region(text, 0, lines_above=0, lines_below=1)
    for name in ("instruct", "zeta", "instinct"):
        prompt = render_edit_prompt(name, context(region=region, hunks=[]))
        assert "'<|im_end|>'" not in prompt.text
        assert "'<|editable_region_end|>'" not in prompt.text


def test_auto_picks_the_format_by_the_models_name():
    assert choose_format("auto", ["qwen2.5-coder-1.5b", None]) == "instruct"
    assert choose_format("auto", [None, "zed-industries/zeta"]) == "zeta"
    assert choose_format("auto", [None, "/models/sweep-next-edit-1.5b.gguf"]) == "sweep"
    assert choose_format("auto", ["", "continuedev/instinct"]) == "instinct"
    assert choose_format("zeta", ["qwen2.5-coder-1.5b"]) == "zeta"


def test_edits_settings_are_validated_in_their_own_section():
    config = load_config({"edits": {"maxDraftLength": 256, "linesAbove": 4, "format": "sweep"}})
    assert (config.edits.max_draft_length, config.edits.lines_above) == (256, 4)
    assert config.decoding.max_draft_length == 12  # the decoding section's own key
    with pytest.raises(ConfigError, match="edits.format"):
        load_config({"edits": {"format": "gpt"}})
    with pytest.raises(ConfigError, match="decoding.max_draft_length"):
        load_config({"decoding": {"max_draft_length": 256}})
    with pytest.raises(ConfigError, match="edits.history_files"):
        load_config({"edits": {"history_files": -1}})


# --- the pipeline with a tiny local model ---------------------------------------------------


EDITS = {"max_new_tokens": 24, "max_draft_length": 40, "model_rewrite": "on"}
"""The model's rewrite is on here (off by default for a model not trained for next edits)."""


@pytest.fixture(scope="module")
def completer():
    from quickdraft.testing import build_tiny_loaded_models, local_completer

    return local_completer(build_tiny_loaded_models(), load_config({"edits": EDITS}))


def test_the_engine_gets_the_prompt_and_the_region_as_copy_source(completer, monkeypatch):
    from quickdraft.next_edit import suggest

    text = "def f(a):\n    return a\n\nx = f(1)\n"
    hunk = Hunk("file:///w/a.py", 0, 0, "def f(b):\n", "def f(a):\n")
    request = NextEditRequest("file:///w/a.py", text, 1, 4, "python", hunks=[hunk])
    seen = []
    generate = completer.backend.engine.generate
    monkeypatch.setattr(
        completer.backend.engine, "generate", lambda req: seen.append(req) or generate(req)
    )
    result = suggest(edit_sources(completer), request, strategy="ngram")
    [sent] = seen
    region = result.region
    assert region.text == text  # the whole (short) file, its empty last line included
    encode = completer.prompts.cache.ids
    assert list(sent.copy_source) == list(encode(region.text + "\n```"))
    assert sent.slot == "file:///w/a.py#edit"  # the document's completion cache is left be
    assert sent.max_new_tokens == 24
    assert sent.max_copy_draft == 40  # edits.max_draft_length, not the default 256
    assert result.format == "instruct" and result.prompt_tokens == len(sent.prompt_ids)
    decoded = completer.tokenizer.decode(sent.prompt_ids)
    assert decoded.endswith("<|im_start|>assistant\n```python\n") and "-def f(b):" in decoded
    # A tiny random model does not close the region in 24 tokens: no edit, and it says why.
    assert result.stop_reason == "max_tokens" and result.edits == []
    assert result.rejected == "the rewrite did not finish the region"
    assert list(result.stages) == [
        "rules_ms",
        "context_ms",
        "tokenize_ms",
        "prefill_ms",
        "decode_ms",
        "diff_ms",
    ]


def test_the_pipeline_counts_the_region_from_the_latest_edit(completer):
    from quickdraft.next_edit import edited_lines, prepare

    text = "".join(f"v{i} = {i}\n" for i in range(40))
    text = text.replace("v20 = 20\n", "v20 = 20\nv20b = 0\nv20c = 0\n")
    # Lines 20-22 were typed; the cursor is at the end of line 22.
    hunk = Hunk(
        "file:///w/b.py", text.index("v20 ="), 20, "v20 = 20\n", "v20 = 20\nv20b = 0\nv20c = 0\n"
    )
    assert edited_lines([hunk]) == (20, 22) and edited_lines([]) is None
    assert edited_lines([Hunk("file:///w/b.py", 0, 5, "gone\n", "")]) == (5, 5)
    request = NextEditRequest("file:///w/b.py", text, 22, 8, "python", hunks=[hunk])
    region = prepare(edit_sources(completer), request).region
    above, below = completer.config.edits.lines_above, completer.config.edits.lines_below
    assert (region.start_line, region.end_line) == (20 - above, 22 + below + 1)


def test_disabled_next_edits_do_no_model_work(completer, monkeypatch):
    from quickdraft.next_edit import suggest

    completer.update_config(load_config({"edits": {"enabled": False}}))
    try:
        monkeypatch.setattr(completer.backend.engine, "generate", None)  # never called
        result = suggest(
            edit_sources(completer), NextEditRequest("file:///w/a.py", "x = 1\n", 0, 0, "python")
        )
        assert result.skipped and result.edits == []
    finally:
        completer.update_config(load_config({"edits": EDITS}))


def test_a_rule_answers_without_the_model_and_says_which(completer, monkeypatch):
    from quickdraft.next_edit import suggest

    completer.update_config(load_config({"edits": {**EDITS, "likelihood_veto": "off"}}))
    try:
        monkeypatch.setattr(completer.backend.engine, "generate", None)  # never called
        monkeypatch.setattr(completer.backend.engine, "likelihoods", None)  # nor this
        text = "def f(a):\n    return b + b\n\nx = f(1)\n"
        hunk = Hunk("file:///w/a.py", 0, 0, "def f(b):\n", "def f(a):\n")
        result = suggest(
            edit_sources(completer),
            NextEditRequest("file:///w/a.py", text, 0, 7, "python", hunks=[hunk]),
        )
        assert [(e.start, e.end, e.text) for e in result.edits] == [(21, 22, "a")]
        assert (result.rule, result.confidence, result.candidates) == ("rename", 0.9, 2)
        assert result.mode == "rule" and list(result.stages) == ["rules_ms"]
        assert result.judged == 0
    finally:
        completer.update_config(load_config({"edits": EDITS}))


def test_without_a_rule_a_model_not_trained_for_next_edits_abstains(completer, monkeypatch):
    from quickdraft.next_edit import model_rewrites, suggest

    completer.update_config(load_config({"edits": {"max_new_tokens": 24}}))  # model_rewrite auto
    try:
        assert not model_rewrites(
            edit_sources(completer)
        )  # the tiny model gets the instruct format
        monkeypatch.setattr(completer.backend.engine, "generate", None)  # never called
        text = "x = 1\n"
        hunk = Hunk("file:///w/a.py", 0, 0, "x = 0\n", "x = 1\n")
        request = NextEditRequest("file:///w/a.py", text, 0, 5, "python", hunks=[hunk])
        result = suggest(edit_sources(completer), request)
        assert result.edits == [] and result.rule is None and "model_rewrite" in result.abstained
        completer.update_config(load_config({"edits": {"format": "zeta"}}))
        assert model_rewrites(edit_sources(completer))
    finally:
        completer.update_config(load_config({"edits": EDITS}))


def test_lines_written_past_the_region_are_not_inserted_again():
    text = "".join(f"line {i}\n" for i in range(20))
    region = choose_region(text, text.index("line 8"), lines_above=2, lines_below=3)
    assert region.text.endswith("line 11") and region.after.startswith("line 12\nline 13")
    # The model made its change, then went on with the file's next lines (it read them).
    wrote_on = region.text.replace("line 9", "line nine") + "\nline 12\nline 13"
    trimmed = without_overrun(region, wrote_on)
    assert trimmed == region.text.replace("line 9", "line nine")
    [edit] = minimal_edits(region.text, trimmed, region.start)
    assert text[edit.start : edit.end] == "9" and edit.text == "nine"
    # ... or started with the lines above it.
    assert without_overrun(region, "line 5\n" + region.text) == region.text
    # A rewrite that only continues the region's own repetition is left as it is.
    assert without_overrun(region, region.text) == region.text
    repeat = choose_region("a\nb\nb\nb\n", 2, lines_above=0, lines_below=1)
    assert repeat.text == "b\nb" and repeat.after.startswith("b")
    assert without_overrun(repeat, "b\nb") == "b\nb"


def test_an_overrun_longer_than_the_lines_shown_is_cut_where_it_starts():
    text = "".join(f"line {i}\n" for i in range(40))
    region = choose_region(text, text.index("line 8"), lines_above=2, lines_below=3)
    shown = region.after.count("\n") + 1
    invented = "".join(f"made up {i}\n" for i in range(5))
    wrote_on = region.text + "\n" + region.after + "\n" + invented.rstrip("\n")
    assert wrote_on.count("\n") > region.text.count("\n") + shown
    assert without_overrun(region, wrote_on) == region.text


def test_blank_lines_left_at_the_regions_end_are_no_edit():
    text = "".join(f"line {i}\n" for i in range(40))
    region = choose_region(text, text.index("line 8"), lines_above=2, lines_below=3)
    assert without_overrun(region, region.text + "\n\n") == region.text
    assert without_overrun(region, region.text + "\n\n" + region.after) == region.text
    assert minimal_edits(region.text, without_overrun(region, region.text + "\n")) == []


# --- stopping where the answer goes on past the region --------------------------------------


def test_an_answer_that_writes_on_past_the_region_is_found_at_its_first_line_past_it():
    from quickdraft.context.edit_prompt import overrun_start

    text = "".join(f"line {i}\n" for i in range(40))
    region = choose_region(text, text.index("line 8"), lines_above=2, lines_below=3)
    edited = region.text.replace("line 9", "line nine")
    assert overrun_start(region, edited) is None  # still inside it
    assert overrun_start(region, edited + "\n") is None  # the last line ended, nothing past
    assert overrun_start(region, edited + "\n```") is None  # the closing: not an overrun
    assert overrun_start(region, edited + "\n\nmade") is None  # a line still being written
    wrote_on = edited + "\n\nmade up 1\nmade up 2\n"
    assert overrun_start(region, wrote_on) == len(edited) + 2
    assert overrun_start(region, "line 6\nline 7\n") is None  # a line short: not yet


def test_a_tail_that_closes_many_blocks_is_made_long_enough_to_be_the_regions_end():
    from quickdraft.context.edit_prompt import overrun_start

    text = "a {\n  if {\n  }\n}\nb {\n  if {\n  }\n}\nc {\n}\n"
    region = choose_region(text, 0, lines_above=0, lines_below=7)
    assert region.text == "a {\n  if {\n  }\n}\nb {\n  if {\n  }\n}"
    first_block = "a {\n  if {\n  }\n}\n"
    assert overrun_start(region, first_block + "b {\n") is None  # `  }` `}` again: mid-region
    assert overrun_start(region, region.text + "\nc {\n") == len(region.text) + 1


def test_generation_stops_at_an_overrun_and_the_rewrite_ends_where_the_region_does(
    completer, monkeypatch
):
    from quickdraft.decoding import GenerationStats
    from quickdraft.generation import Generated
    from quickdraft.next_edit import prepare, suggest

    text = "".join(f"line {i}\n" for i in range(40))
    request = NextEditRequest("file:///w/b.py", text, 8, 0, "python")
    prepared = prepare(edit_sources(completer), request)
    region = prepared.region
    lines = region.text.split("\n")
    edited = "\n".join([lines[0], "changed", *lines[2:]])
    wrote_on = edited + "\n" + region.after.split("\n")[0] + "\n"
    encode = completer.prompts.cache.ids
    assert prepared.text_stop_rule()(wrote_on) and not prepared.text_stop_rule()(edited)
    assert prepared.stop_rule()(list(encode(wrote_on)))
    assert not prepared.stop_rule()(list(encode(edited + "\n")))

    def generate_edit(prepared, **_):
        return Generated(wrote_on, list(encode(wrote_on)), "stop", GenerationStats())

    monkeypatch.setattr(completer.backend, "generate_edit", generate_edit)
    result = suggest(edit_sources(completer), request)
    assert result.rewritten == edited and result.rejected is None
    [edit] = result.edits
    assert edit.text == "changed" and text[edit.start : edit.end] == lines[1]
