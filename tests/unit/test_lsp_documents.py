"""The document store: incremental edits addressed in UTF-16 (and UTF-8/32), positions both ways."""

from __future__ import annotations

import pytest

from quickdraft.errors import PositionError
from quickdraft.lsp.documents import (
    UTF8,
    UTF16,
    UTF32,
    Document,
    DocumentStore,
    codepoint_column,
    lsp_column,
    units,
)

EMOJI = "😀"  # U+1F600: 2 UTF-16 units, 4 UTF-8 bytes
CJK = "中"  # U+4E2D: 1 UTF-16 unit, 3 UTF-8 bytes


def test_units_per_encoding():
    text = f"a{EMOJI}{CJK}é"
    assert units(text, UTF16) == 1 + 2 + 1 + 1
    assert units(text, UTF8) == 1 + 4 + 3 + 2
    assert units(text, UTF32) == 4


@pytest.mark.parametrize(
    ("encoding", "character", "expected"),
    [
        (UTF16, 0, 0),
        (UTF16, 1, 1),  # after 'a'
        (UTF16, 3, 2),  # after the emoji
        (UTF16, 2, 1),  # inside the surrogate pair: rounds down to the emoji's start
        (UTF16, 4, 3),  # after '中'
        (UTF8, 5, 2),
        (UTF8, 8, 3),
        (UTF32, 3, 3),
    ],
)
def test_codepoint_column(encoding, character, expected):
    line = f"a{EMOJI}{CJK}b"
    assert codepoint_column(line, character, encoding) == expected


def test_codepoint_column_past_the_end_clamps_or_raises():
    line = f"{EMOJI}x"
    assert codepoint_column(line, 99, UTF16) == 2
    with pytest.raises(PositionError):
        codepoint_column(line, 4, UTF16, strict=True)
    assert codepoint_column(line, 3, UTF16, strict=True) == 2
    with pytest.raises(PositionError):
        codepoint_column("abc", 4, UTF16, strict=True)


def test_lsp_column_round_trips():
    line = f"x{EMOJI}{CJK}{EMOJI}y"
    for column in range(len(line) + 1):
        assert codepoint_column(line, lsp_column(line, column, UTF16), UTF16) == column
        assert codepoint_column(line, lsp_column(line, column, UTF8), UTF8) == column


def test_lines_with_every_line_break():
    doc = Document("file:///a", "one\r\ntwo\rthree\nfour")
    assert doc.line_count == 4
    assert [doc.line_text(i) for i in range(4)] == ["one", "two", "three", "four"]
    assert doc.offset_at(1, 0) == 5
    assert doc.offset_at(3, 4) == len(doc.text)
    assert doc.position_at(5) == (1, 0)
    assert doc.position_at(4) == (0, 3)  # between \r and \n: clamped to the line end


def test_trailing_newline_makes_an_empty_last_line():
    doc = Document("file:///a", "x\n")
    assert doc.line_count == 2
    assert doc.line_text(1) == ""
    assert doc.offset_at(1, 0) == 2
    with pytest.raises(PositionError):
        doc.offset_at(2, 0)


def test_incremental_edit_with_utf16_range():
    doc = Document("file:///a", f"s = '{EMOJI}{CJK}'\nnext\n")
    # Replace '中' (UTF-16 units 7..8 on line 0) with two characters.
    doc.apply_change("文字", (0, 7, 0, 8))
    assert doc.text == f"s = '{EMOJI}文字'\nnext\n"
    # Insert after the emoji (unit 7), delete across the line break.
    doc.apply_change("!", (0, 7, 0, 7))
    assert doc.line_text(0) == f"s = '{EMOJI}!文字'"
    doc.apply_change("", (0, 11, 1, 0))  # unit 11 is after the closing quote
    assert doc.text == f"s = '{EMOJI}!文字'next\n"
    doc.apply_change("", (0, 10, 0, 11))
    assert doc.text == f"s = '{EMOJI}!文字next\n"


def test_edit_positions_past_the_end_clamp():
    doc = Document("file:///a", "ab\ncd")
    doc.apply_change("X", (0, 99, 0, 99))  # past the line end: at the line end
    assert doc.text == "abX\ncd"
    doc.apply_change("!", (9, 0, 9, 0))  # past the last line: at the document end
    assert doc.text == "abX\ncd!"


def test_edits_in_utf8_and_utf32_documents():
    doc = Document("file:///a", f"{EMOJI}{CJK}x", encoding=UTF8)
    doc.apply_change("-", (0, 7, 0, 7))  # after '中' = 4 + 3 bytes
    assert doc.text == f"{EMOJI}{CJK}-x"
    doc = Document("file:///a", f"{EMOJI}{CJK}x", encoding=UTF32)
    doc.apply_change("-", (0, 1, 0, 1))
    assert doc.text == f"{EMOJI}-{CJK}x"


def test_position_at_and_from_codepoint():
    doc = Document("file:///a", f"{EMOJI}a\n{CJK}{EMOJI}b")
    assert doc.position_at(2) == (0, 3)
    assert doc.position_at(len(doc.text)) == (1, 4)
    assert doc.from_codepoint(1, 2) == 3
    assert doc.to_codepoint(1, 3) == 2


def test_unusable_reason():
    assert Document("u", "abc").unusable_reason(10) is None
    assert "larger" in Document("u", "x" * 11).unusable_reason(10)
    assert "larger" in Document("u", CJK * 4).unusable_reason(10)  # 12 bytes, 4 code points
    assert Document("u", CJK * 3).unusable_reason(10) is None  # 9 bytes
    assert "NUL" in Document("u", "a\x00b").unusable_reason(10)


def test_store_open_change_close():
    store = DocumentStore(UTF16)
    store.open("file:///a", "hello", "python", 1)
    assert "file:///a" in store and len(store) == 1
    doc = store.change("file:///a", [("J", (0, 0, 0, 1)), (" world", (0, 5, 0, 5))], version=2)
    assert doc.text == "Jello world" and doc.version == 2
    store.change("file:///a", [("whole", None)], version=3)
    assert store.get("file:///a").text == "whole"
    with pytest.raises(KeyError):
        store.change("file:///missing", [("x", None)])
    assert store.close("file:///a").text == "whole"
    assert store.get("file:///a") is None


def test_the_line_index_follows_edits_without_being_rebuilt():
    """Random edits over CR, LF and CRLF text: the updated line starts equal a full rescan."""
    import random

    from quickdraft.text import LINE_BREAK

    rng = random.Random(7)
    pieces = ["a", "bc", "\n", "\r", "\r\n", "x y", "\n\n", "é", "😀"]
    for _ in range(400):
        doc = Document("file:///t", "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))))
        assert doc.line_starts  # built once
        for _ in range(6):
            lines = doc.line_count
            first = rng.randrange(lines)
            last = rng.randrange(first, lines)
            start, end = rng.randint(0, 6), rng.randint(0, 6)
            if first == last and end < start:
                start, end = end, start
            inserted = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))
            doc.apply_change(inserted, (first, start, last, end))
            assert doc._line_starts is not None  # updated, not dropped
            assert doc.line_starts == [0] + [m.end() for m in LINE_BREAK.finditer(doc.text)]
