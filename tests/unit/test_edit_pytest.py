"""The `parametrize` rule (context/edit_pytest.py) on a real test file: a parametrize decorator
added or given another name -> the names its test lacks added to the test's parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from quickdraft.context import syntax
from quickdraft.context.edit_history import EditHistory
from quickdraft.context.edit_proposals import propose
from quickdraft.context.edit_rules import FLOOR, latest_edit
from quickdraft.context.edit_vetoes import applied, vet

pytestmark = pytest.mark.skipif(
    syntax.tree_sitter_language("python") is None, reason="the Python grammar is not installed"
)

URI = "file:///work/tests/test_import.py"
CHECKS = (Path(__file__).parent / "data" / "ledger_checks.py").read_text()
EMPTY_FILE = "def test_import_of_an_empty_file"


def shown_after(before: str, after: str) -> str | None:
    """The file once the edit the rules show after `before` -> `after` is taken, or None when
    they show none."""
    history = EditHistory()
    history.record_full(URI, before, after)
    edit = latest_edit(URI, after, history.hunks(URI), "python")
    decision = vet(edit, propose(edit))
    if decision.shown is None:
        return None
    assert decision.rule == "parametrize" and decision.confidence >= FLOOR
    return applied(after, decision.shown)


def decorated(text: str, function: str, decorator: str) -> str:
    """`text` with `decorator` put right above `def function(`."""
    at = text.index(f"def {function}(")
    return text[:at] + decorator + "\n" + text[at:]


def empty_file_test_becomes(text: str, decorator: str, parameters: str) -> None:
    """`text`'s test of an empty file given `decorator`: the edit shown gives it `parameters`."""
    after = decorated(text, "test_import_of_an_empty_file", decorator)
    assert shown_after(text, after) == after.replace(
        f"{EMPTY_FILE}(tester: ImportCommand, tmp_path: Path)", f"{EMPTY_FILE}({parameters})"
    )


def shows_as(after: str, old: str, new: str) -> None:
    """CHECKS edited into `after`: the edit shown gives `after` with `old` made `new`."""
    assert shown_after(CHECKS, after) == after.replace(old, new)


def test_a_decorator_added_between_two_puts_its_parameter_between_theirs_typed():
    after = CHECKS.replace(
        '@pytest.mark.parametrize("with_header", [False, True])\n',
        '@pytest.mark.parametrize("with_header", [False, True])\n'
        '@pytest.mark.parametrize("encoding", ["utf-8", "latin-1", None])\n',
    )
    shows_as(
        after, "    with_header: bool,\n", "    with_header: bool,\n    encoding: str | None,\n"
    )


def test_names_of_a_new_decorator_go_after_the_fixtures_on_an_inline_signature():
    decorator = '@pytest.mark.parametrize(("rows", "quiet"), [([], True), (["x"], False)])'
    after = decorated(CHECKS, "test_import_reports_bad_rows", decorator)
    shows_as(
        after,
        "mocker: MockerFixture\n) -> None:",
        "mocker: MockerFixture, rows: list[str], quiet: bool\n) -> None:",
    )
    # Values of no one type: the name goes in bare.
    empty_file_test_becomes(
        CHECKS,
        '@pytest.mark.parametrize("size", [0, "large"])',
        "tester: ImportCommand, tmp_path: Path, size",
    )


def test_a_file_whose_tests_take_them_first_gets_them_first():
    first = CHECKS.replace(
        "    tester: ImportCommand,\n    tmp_path: Path,\n    currency: str,\n",
        "    currency: str,\n    tester: ImportCommand,\n    tmp_path: Path,\n",
    ).replace(
        "    tmp_path: Path,\n    strict: bool,\n    with_header: bool,\n",
        "    strict: bool,\n    with_header: bool,\n    tmp_path: Path,\n",
    )
    first = first.replace("    tester: ImportCommand,\n    strict", "    strict").replace(
        '    tmp_path: Path,\n) -> None:\n    statement = tmp_path / "statement.csv"\n    header',
        "    tester: ImportCommand,\n    tmp_path: Path,\n) -> None:\n"
        '    statement = tmp_path / "statement.csv"\n    header',
    )
    empty_file_test_becomes(
        first,
        '@pytest.mark.parametrize("limit", [1, 2])',
        "limit: int, tester: ImportCommand, tmp_path: Path",
    )


def test_names_in_parentheses_are_names_too():
    empty_file_test_becomes(
        CHECKS,
        '@pytest.mark.parametrize(("label"), ["a", "b"])',
        "tester: ImportCommand, tmp_path: Path, label: str",
    )


def test_a_method_with_a_default_takes_the_name_before_the_default():
    after = CHECKS.replace(
        "    def test_amounts_round_half_even(",
        '    @pytest.mark.parametrize("amount", ["0.125", "0.135"])\n'
        "    def test_amounts_round_half_even(",
    )
    shows_as(
        after,
        "(self, tester: ImportCommand, places: int = 2)",
        "(self, tester: ImportCommand, amount: str, places: int = 2)",
    )


def test_nothing_is_proposed_for_names_the_test_takes_or_a_decorator_not_touched():
    # The name the test already takes: renamed in the decorator's values only.
    after = CHECKS.replace('["EUR", "USD"]', '["EUR", "USD", "GBP"]')
    assert shown_after(CHECKS, after) is None
    # Another line of the test edited: the decorators above it were not touched.
    after = CHECKS.replace("assert len(tester.rows) == 1", "assert len(tester.rows) == 2")
    assert shown_after(CHECKS, after) is None
