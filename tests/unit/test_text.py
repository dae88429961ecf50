"""The text rules every layer shares (quickdraft.text)."""

from __future__ import annotations

import pytest

from quickdraft.text import position_after, split_lines


@pytest.mark.parametrize(
    ("inserted", "after"),
    [
        ("", (3, 4)),
        ("abc", (3, 7)),
        ("abc\n", (4, 0)),
        ("a\r\nbc", (4, 2)),  # CRLF is one break
        ("a\rb\rcd", (5, 2)),  # so is a lone CR (LSP)
        ("x\n\ny", (5, 1)),
    ],
)
def test_the_position_after_an_insertion_counts_lsp_line_breaks(inserted, after):
    assert position_after(3, 4, inserted) == after


def test_split_lines_keeps_every_break():
    assert split_lines("a\r\nb\rc\nd") == (["a", "b", "c", "d"], ["\r\n", "\r", "\n", ""])
