"""Tests of a ledger's import command, as a project's test suite would hold them (the data of
tests/unit/test_edit_pytest.py: it is read as text, never collected)."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

import pytest

from ledger.commands.import_ import ImportCommand
from ledger.rows import Row

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_mock import MockerFixture

    from tests.types import CommandTesterFactory


@pytest.fixture
def tester(command_tester_factory: CommandTesterFactory) -> ImportCommand:
    return command_tester_factory("import")


@pytest.mark.parametrize("currency", ["EUR", "USD"])
def test_import_keeps_the_currency(
    tester: ImportCommand,
    tmp_path: Path,
    currency: str,
) -> None:
    statement = tmp_path / "statement.csv"
    statement.write_text(f"date,amount,currency\n2025-01-02,12.50,{currency}\n")
    tester.execute(str(statement))
    assert tester.rows == [Row("2025-01-02", Decimal("12.50"), currency)]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("with_header", [False, True])
def test_import_reads_headers(
    tester: ImportCommand,
    tmp_path: Path,
    strict: bool,
    with_header: bool,
) -> None:
    statement = tmp_path / "statement.csv"
    header = "date,amount,currency\n" if with_header else ""
    statement.write_text(header + "2025-01-02,12.50,EUR\n")
    tester.execute(f"{statement} --strict" if strict else str(statement))
    assert len(tester.rows) == 1


def test_import_reports_bad_rows(
    tester: ImportCommand, tmp_path: Path, mocker: MockerFixture
) -> None:
    statement = tmp_path / "statement.csv"
    statement.write_text("date,amount,currency\n2025-01-02,twelve,EUR\n")
    warn = mocker.patch("ledger.commands.import_.warn")
    tester.execute(str(statement))
    warn.assert_called_once()


def test_import_of_an_empty_file(tester: ImportCommand, tmp_path: Path) -> None:
    statement = tmp_path / "statement.csv"
    statement.write_text("")
    tester.execute(str(statement))
    assert tester.rows == []


class TestRounding:
    def test_amounts_round_half_even(self, tester: ImportCommand, places: int = 2) -> None:
        assert tester.round(Decimal("0.125"), places) == Decimal("0.12")
