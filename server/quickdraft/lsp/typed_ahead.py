"""Typed-ahead reuse: the user typed the start of the current suggestion, so answer from it.

One suggestion is remembered per document, with the document text it was made for. A later
request whose document equals that text except for characters inserted at the cursor, which
match the start of the suggestion, is answered from it without calling the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Entry:
    text: str
    """The document when the suggestion was made."""
    start: int
    """Offset (code points) where the suggestion begins (before the cursor when it heals)."""
    cursor: int
    end: int
    """Offset where the replaced text ends (after the cursor when it replaces a bracket)."""
    suggestion: str


class TypedAhead:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def remember(self, uri: str, text: str, start: int, cursor: int, end: int, suggestion: str):
        self._entries[uri] = _Entry(text, start, cursor, end, suggestion)

    def forget(self, uri: str) -> None:
        self._entries.pop(uri, None)

    def clear(self) -> None:
        self._entries.clear()

    def lookup(self, uri: str, text: str, offset: int) -> tuple[int, str, int] | None:
        """(start, suggestion, replace_after) when `text` is the remembered document with a
        prefix of the suggestion typed at its cursor and the cursor now at `offset`."""
        entry = self._entries.get(uri)
        if entry is None:
            return None
        typed_len = offset - entry.start
        if (
            offset < entry.cursor
            or len(text) - len(entry.text) != offset - entry.cursor
            or typed_len >= len(entry.suggestion)
            or not entry.suggestion.startswith(text[entry.start : offset])
            or text[offset:] != entry.text[entry.cursor :]
            or text[: entry.start] != entry.text[: entry.start]
        ):
            del self._entries[uri]
            return None
        return entry.start, entry.suggestion, entry.end - entry.cursor
