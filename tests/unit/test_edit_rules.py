"""Next edits from the edit itself (context/edit_rules.py) and their vetoes (edit_vetoes.py), on a
real file: tests/unit/data/financial_manager.py is examples/financial_research_agent/manager.py
of openai/openai-agents-python (MIT) at 7f7a44f8, unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from quickdraft.context import syntax
from quickdraft.context.edit_history import EditHistory, Hunk
from quickdraft.context.edit_proposals import propose
from quickdraft.context.edit_rules import (
    FLOOR,
    Candidate,
    TextEdit,
    latest_edit,
)
from quickdraft.context.edit_vetoes import applied, vet
from quickdraft.context.edit_words import names_something

pytestmark = pytest.mark.skipif(
    syntax.tree_sitter_language("python") is None, reason="the Python grammar is not installed"
)

URI = "file:///work/manager.py"
MANAGER = (Path(__file__).parent / "data" / "financial_manager.py").read_text()


def edited(before: str, after: str, history: EditHistory | None = None):
    history = history or EditHistory()
    history.record_full(URI, before, after)
    return latest_edit(URI, after, history.hunks(URI), "python"), history


def replace_line(text: str, line: int, old: str, new: str) -> str:
    """`text` with `old` replaced by `new` once on 1-based `line`."""
    lines = text.split("\n")
    assert old in lines[line - 1], lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    return "\n".join(lines)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def proposals(line: int, old: str, new: str):
    """(the text after replacing `old` by `new` on `line` of the real file, the latest edit,
    the rules' candidates, and each as (rule, line, text))."""
    after = replace_line(MANAGER, line, old, new)
    edit, _ = edited(MANAGER, after)
    candidates = propose(edit)
    seen = [(c.rule, line_of(after, c.edit.start), c.edit.text) for c in candidates]
    return after, edit, candidates, seen


def test_a_renamed_parameter_proposes_its_uses_in_the_function_and_nothing_outside():
    after = replace_line(MANAGER, 103, "query", "question")
    edit, _ = edited(MANAGER, after)
    candidates = propose(edit)
    assert {c.rule for c in candidates} == {"rename"}
    assert all(c.edit.text == "question" for c in candidates)
    assert all(after[c.edit.start : c.edit.end] == "query" for c in candidates)
    # `_produce_verified_report`'s body (lines 104-118), nearest first; not `run`'s `query`
    # above it, nor `_plan_searches`' below, nor `item.query`.
    assert [line_of(after, c.edit.start) for c in candidates] == [106, 107, 111, 112]


def test_tab_after_tab_finishes_the_rename_then_abstains():
    """Each answer is one edit; applied, it is the latest edit, and the next answer is the next
    use, until none is left: then no edit."""
    shown_lines, text = tab_through(
        MANAGER, replace_line(MANAGER, 103, "query", "question"), "rename"
    )
    assert shown_lines == [106, 107, 111, 112]
    lines_before, lines_after = MANAGER.split("\n"), text.split("\n")
    for number, (old, new) in enumerate(zip(lines_before, lines_after, strict=True), 1):
        expected = old.replace("query", "question") if 103 <= number <= 112 else old
        assert new == expected, number


def test_a_repeated_string_change_is_replayed_where_the_old_string_still_stands():
    after, edit, candidates, seen = proposals(121, '"planning"', '"plan"')
    assert seen == [("repeat", 124, '"plan"')]
    assert after[candidates[0].edit.start : candidates[0].edit.end] == '"planning"'
    decision = vet(edit, candidates)
    assert decision.shown == candidates[0] and decision.parses == 1


def test_a_renamed_method_of_self_proposes_its_def_and_other_calls_in_the_class():
    *_, seen = proposals(107, "self._verify_report(", "self._check_report(")
    # A method name of `self` renamed: its definition and the other call, in the class.
    assert seen == [("rename", 112, "_check_report"), ("rename", 233, "_check_report")]


def test_a_removed_parameter_drops_the_argument_at_its_calls():
    after, _, candidates, seen = proposals(235, "query: str,", "")
    assert seen == [("signature", 112, ""), ("signature", 107, "")]
    fixed = after
    for candidate in sorted(candidates, key=lambda c: -c.edit.start):
        fixed = applied(fixed, candidate)
    assert fixed.count("self._verify_report(report, search_results)") == 2
    assert "self._verify_report(query" not in fixed


def test_a_renamed_import_proposes_its_uses():
    *_, seen = proposals(21, "import Printer", "import ReportPrinter")
    assert seen == [("import", 70, "ReportPrinter")]


def insert_line(text: str, after_line: int, line: str) -> str:
    """`text` with `line` inserted after 1-based `after_line`."""
    lines = text.split("\n")
    lines.insert(after_line, line)
    return "\n".join(lines)


def test_an_import_of_a_name_another_import_binds_removes_the_other():
    # `Runner` now comes from `agents.run`: the old binding goes from line 12's list.
    after = insert_line(MANAGER, 13, "from agents.run import Runner")
    edit, _ = edited(MANAGER, after)
    candidates = propose(edit)
    assert [(c.rule, line_of(after, c.edit.start)) for c in candidates] == [("import", 12)]
    fixed = applied(after, vet(edit, candidates).shown)
    assert fixed.split("\n")[11] == (
        "from agents import RunResult, RunResultStreaming, custom_span, gen_trace_id, trace"
    )
    # The only name of its statement: the statement's line goes.
    after = insert_line(MANAGER, 20, "from .report_printer import Printer")
    edit, _ = edited(MANAGER, after)
    candidates = propose(edit)
    assert [(c.rule, line_of(after, c.edit.start), c.edit.text) for c in candidates] == [
        ("import", 22, "")
    ]
    fixed = applied(after, candidates[0])
    assert "from .printer import Printer" not in fixed
    assert fixed.count("from .report_printer import Printer") == 1


def test_an_import_on_the_hunks_unchanged_lines_is_not_taken_for_the_added_one():
    # A hunk that coalesced a typed line with its unchanged neighbour: `from n import a` was
    # there before, so `from m import a` is no older binding of a moved name.
    before = "from m import a\nimport os\nfrom n import a\n"
    after = "from m import a\nimport os\nimport sys\nfrom n import a\n"
    start = before.index("from n")
    hunk = Hunk(URI, start, 2, "from n import a\n", "import sys\nfrom n import a\n")
    edit = latest_edit(URI, after, [hunk], "python")
    assert edit is not None and edit.before == before
    assert propose(edit) == []


def test_a_builtin_the_change_keeps_is_part_of_the_pattern_not_a_hole():
    text = (
        "def a(lines):\n"
        '    total = len("".join(lines))\n'
        "    return total\n"
        "\n"
        "\n"
        "def b(parts):\n"
        '    size = len("".join(parts))\n'
        "    return size\n"
    )
    after = text.replace('len("".join(lines))', "sum(len(line) for line in lines)")
    edit, _ = edited(text, after)
    seen = [(c.rule, line_of(after, c.edit.start), c.edit.text) for c in propose(edit)]
    assert seen == [("repeat", 7, "sum(len(line) for line in parts)")]


def test_a_one_off_change_proposes_nothing():
    after = replace_line(MANAGER, 88, "Report summary", "Summary of the report")
    edit, _ = edited(MANAGER, after)
    decision = vet(edit, propose(edit))
    assert decision.shown is None and decision.rule is None


def test_the_vetoes_floor_undo_and_parse():
    after = replace_line(MANAGER, 121, '"planning"', '"plan"')
    edit, _ = edited(MANAGER, after)
    at = after.index('"planning"')
    low = Candidate("repeat", TextEdit(at, at + 10, '"plan"'), FLOOR - 0.01)
    start = after.index('"plan"')
    undo = Candidate("repeat", TextEdit(start, start + 6, '"planning"'), 0.9)
    broken = Candidate("repeat", TextEdit(at, at + 10, '"plan'), 0.9)
    good = Candidate("repeat", TextEdit(at, at + 10, '"plan"'), 0.6)
    decision = vet(edit, [low, undo, broken, good])
    assert decision.vetoed == {"floor": 1, "undo": 1, "parse": 1}
    assert decision.shown == good and decision.candidates == 4


def test_a_history_that_no_longer_matches_the_text_gives_no_latest_edit():
    after = replace_line(MANAGER, 121, '"planning"', '"plan"')
    _, history = edited(MANAGER, after)
    assert latest_edit(URI, MANAGER, history.hunks(URI), "python") is None
    assert latest_edit(URI, MANAGER, [], "python") is None


def test_offsets_are_code_points_past_non_ascii_text():
    before = 's = "héllo wörld"\ndef f(width):\n    """ünïcode"""\n    return width * 2\n'
    after = before.replace("f(width)", "f(w)")
    edit, _ = edited(before, after)
    [candidate] = propose(edit)
    assert after[candidate.edit.start : candidate.edit.end] == "width"
    assert applied(after, candidate) == before.replace("width", "w")


def test_a_string_change_in_another_language_is_replayed_by_tokens():
    before = 'const a = get("old-key");\nconst b = get("old-key");\n'
    after = before.replace('"old-key"', '"new-key"', 1)
    history = EditHistory()
    history.record_full("file:///a.js", before, after)
    edit = latest_edit("file:///a.js", after, history.hunks("file:///a.js"), "javascript")
    decision = vet(edit, propose(edit))
    assert decision.rule == "repeat"
    assert applied(after, decision.shown) == before.replace("old-key", "new-key")


# --- rules for edits the language binds nothing to, and for moved statements ------------------


def tab_through(before: str, after: str, rule: str) -> tuple[list[int], str]:
    """Edit `before` into `after`, then take each edit shown (all from `rule`) as Tab would,
    until none is: (the line of each, the text at the end)."""
    text, history = after, EditHistory()
    history.record_full(URI, before, after)
    shown = []
    for _ in range(8):
        edit = latest_edit(URI, text, history.hunks(URI), "python")
        decision = vet(edit, propose(edit))
        if decision.shown is None:
            break
        assert decision.rule == rule and decision.confidence >= FLOOR
        shown.append(line_of(text, decision.shown.edit.start))
        new = applied(text, decision.shown)
        history.record_full(URI, text, new)
        text = new
    return shown, text


def test_a_renamed_method_definition_proposes_its_calls_through_self():
    *_, seen = proposals(120, "def _plan_searches(", "def _plan_search(")
    assert seen == [("rename", 84, "_plan_search")]


def test_a_word_changed_in_a_comment_is_replayed_in_prose_and_never_in_code():
    after, edit, candidates, seen = proposals(58, "an AnalysisSummary", "an AnalysisDigest")
    # The docstring above says it too; the code's `summary` and the import are other words.
    assert seen == [("word", 57, "AnalysisDigest")]
    assert after[candidates[0].edit.start : candidates[0].edit.end] == "AnalysisSummary"
    assert vet(edit, candidates).shown == candidates[0]


def test_a_plain_word_reworded_in_a_comment_proposes_nothing():
    # "emit" -> "return" is a change of wording, not of what the text names.
    *_, seen = proposals(58, "agents emit an", "agents return an")
    assert seen == []


def test_a_fixed_typo_is_fixed_in_the_other_comments_with_its_case():
    text = MANAGER.replace("# Print to stdout", "# Prinnt the report to stdout\n        # prinnt")
    after = text.replace("# Prinnt the", "# Print the", 1)
    edit, _ = edited(text, after)
    seen = [(c.rule, line_of(after, c.edit.start), c.edit.text) for c in propose(edit)]
    assert seen == [("word", 94, "print")]
    # A word given another ending is another word, not a typo fixed.
    reworded = text.replace("# Prinnt the report", "# Prinnt the reports", 1)
    edit, _ = edited(text, reworded)
    assert propose(edit) == []


def test_text_changed_inside_a_string_is_replayed_in_the_other_strings_only():
    # A non-breaking hyphen made a plain one in one tool description: the other has it too.
    after, edit, candidates, seen = proposals(188, "short write\u2011up", "short write-up")
    assert seen == [("text", 193, " write-up ")]
    assert after[candidates[0].edit.start : candidates[0].edit.end] == " write\u2011up "
    assert vet(edit, candidates).shown == candidates[0]
    # Text that reads as code is replayed in prose, never in the code that holds it too
    # (`trace(..., trace_id=trace_id)` on line 76).
    text = MANAGER.replace('"Search the web"', '"Search the web, trace_id=trace_id"')
    text = text.replace('"Searching..."', '"Searching, trace_id=trace_id"')
    changed = text.replace('trace_id=trace_id"', 'trace_id=trace-id"', 1)
    edit, _ = edited(text, changed)
    assert "=trace_id" in text.split("\n")[75]
    seen = [(c.rule, line_of(changed, c.edit.start), c.edit.text) for c in propose(edit)]
    assert seen == [("text", 134, "=trace-id")]


def test_a_phrase_reworded_in_a_string_proposes_nothing():
    # "report" -> "the report": wording, not a name; the other messages keep theirs.
    *_, seen = proposals(197, "Thinking about report...", "Thinking about the report...")
    assert seen == []
    *_, seen = proposals(134, '"Searching..."', '"Searching the web..."')
    assert seen == []
    # A word wrapped in brackets is not a typo fixed.
    *_, seen = proposals(188, "short write\u2011up of key", "short (write\u2011up) of key")
    assert seen == []


def test_a_line_made_several_is_replayed_with_each_site_s_indentation():
    before = MANAGER.replace(
        "        finally:\n            self.printer.end()",
        "        finally:\n            self.printer.end()\n"
        "            if verbose:\n                self.printer.end()",
    )
    after = before.replace(
        "            self.printer.end()",
        "            self.printer.end(\n                flush=True,\n            )",
        1,
    )
    edit, _ = edited(before, after)
    candidates = propose(edit)
    assert [c.rule for c in candidates] == ["repeat"]
    fixed = applied(after, candidates[0])
    assert (
        "                self.printer.end(\n                    flush=True,\n                )"
        in (fixed)
    )


def test_a_line_moved_above_its_copies_removes_them():
    before = MANAGER.replace(
        "        report = await self._write_report(query, search_results)\n",
        "        report = await self._write_report(query, search_results)\n"
        "        self.printer.mark_item_done('writing')\n",
    ).replace(
        "        report = await self._revise_report(query, report, search_results, verification)\n",
        "        report = await self._revise_report(query, report, search_results, verification)\n"
        "        self.printer.mark_item_done('writing')\n",
    )
    after = before.replace(
        "        report = await self._write_report(",
        "        self.printer.mark_item_done('writing')\n        report = await self._write_report(",
        1,
    )
    shown, text = tab_through(before, after, "hoist")
    # Both copies below, one Tab each (the second found from the first Tab's deletion).
    assert shown == [108, 113]
    assert text.count("self.printer.mark_item_done('writing')") == 1


def test_a_deleted_variable_is_inlined_at_its_uses():
    before = MANAGER.replace(
        "        report = await self._write_report(query, search_results)\n",
        "        results = search_results\n"
        "        report = await self._write_report(query, results)\n",
    ).replace(
        "        verification = await self._verify_report(query, report, search_results)\n"
        "        if verification.verified:",
        "        verification = await self._verify_report(query, report, results)\n"
        "        if verification.verified:",
    )
    after = before.replace("        results = search_results\n", "", 1)
    shown, text = tab_through(before, after, "inline")
    assert shown == [106, 107]
    assert text == MANAGER


def test_a_deleted_variable_that_is_still_assigned_is_not_inlined():
    # `report` is assigned again below: deleting its first assignment inlines nothing.
    after = MANAGER.replace(
        "        report = await self._write_report(query, search_results)\n", "", 1
    )
    edit, _ = edited(MANAGER, after)
    assert propose(edit) == []


def test_changed_lines_are_replayed_where_the_same_lines_stand_and_not_in_a_docstring():
    block = '        assert ns.hello\n        assert ns.file_or_dir == ["x"]\n'
    before = (
        "def test_parse(parser):\n"
        '    ns = parser.parse_known_args(["x", "--y", "--hello", "this"])\n'
        + block.replace("        ", "    ")
        + "\n\nclass TestParser:\n    def test_unknown(self, parser):\n"
        '        """\n' + block + '        """\n'
        '        ns, unknown = parser.parse_known_and_unknown_args(["x", "this"])\n'
        + block
        + '        assert unknown == ["--y", "this"]\n'
    )
    after = before.replace(
        '    assert ns.hello\n    assert ns.file_or_dir == ["x"]\n',
        '    assert ns.hello is True\n    assert ns.file_or_dir == ["x", "this"]\n',
        1,
    )
    edit, _ = edited(before, after)
    candidates = propose(edit)
    # The two lines again in the method, at its indentation; the docstring's copy is left.
    assert [(c.rule, line_of(after, c.edit.start)) for c in candidates] == [("lines", 14)]
    fixed = applied(after, candidates[0])
    assert '        assert ns.hello is True\n        assert ns.file_or_dir == ["x", "this"]\n' in (
        fixed
    )
    assert fixed.count("assert ns.hello\n") == 1  # the docstring's
    # The rule stands under the floor (too often harmful on the histories): measured, not shown.
    assert candidates[0].confidence < FLOOR and vet(edit, candidates).shown is None


def test_a_hunk_renaming_several_names_renames_each():
    *_, seen = proposals(
        19,
        "import VerificationResult, verifier_agent",
        "import VerificationReport, report_verifier",
    )
    assert sorted(seen) == [
        ("import", 105, "VerificationReport"),
        ("import", 220, "VerificationReport"),
        ("import", 238, "VerificationReport"),
        ("import", 241, "report_verifier"),
        ("import", 245, "VerificationReport"),
    ]


def test_a_dotted_name_made_in_a_string_is_replayed_in_another_definition_at_the_floor():
    # `data.` -> `tool.poetry.` names something (a dotted name), so the other string with
    # `data.` gets it, though it stands in another top-level definition (REPEAT_FAR less: at
    # the floor exactly, and shown).
    text = MANAGER.replace('"Starting financial research..."', '"Starting data.research..."')
    text = text.replace("that return an AnalysisSummary.", "that return data.research.")
    changed = text.replace("Starting data.research", "Starting tool.poetry.research")
    edit, _ = edited(text, changed)
    candidates = propose(edit)
    seen = [(c.rule, line_of(changed, c.edit.start), c.edit.text) for c in candidates]
    assert seen == [("text", 57, " tool.poetry.")]
    assert candidates[0].confidence == FLOOR and vet(edit, candidates).shown == candidates[0]


def test_a_phrase_reworded_around_a_code_like_word_or_an_acronym_proposes_nothing():
    # Only the words that changed are read: `v1` and `API` stand in both versions or are
    # acronyms, and "Taken ... as is" -> "Adapted" is wording.
    for old, new in [
        ("Taken from Pydantic v1 as is", "Adapted from Pydantic v1"),
        ("to interact with the Inference API", "that uses the Transformers library"),
    ]:
        text = MANAGER.replace('"Searching..."', f'"Searching: {old}"').replace(
            '"Thinking about report..."', f'"Writing: {old}"'
        )
        edit, _ = edited(text, text.replace(f"Searching: {old}", f"Searching: {new}"))
        assert propose(edit) == [], old
        # Before, the digit and the capitals of the words kept made these names.
        assert names_something(old, new) is False
