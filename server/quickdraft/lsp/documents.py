"""The server's copy of every open document, kept in step by open/change/close.

LSP positions count characters in the encoding negotiated at `initialize` (UTF-16 unless the
client offers otherwise); Python strings count code points. Everything in this module that takes
or returns a `character` says which of the two it means. The Completer only ever sees code
points (`Document.to_codepoint`), and ranges go back to the client through
`Document.from_codepoint`; `completion_request` is the Completer's request for a place in a
document.

Lines end at `\\n`, `\\r\\n` or `\\r`, as the LSP specification says.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

from quickdraft.context.edit_history import EditHistory, lines_touched
from quickdraft.errors import PositionError
from quickdraft.generation import CompletionRequest, NextEditRequest
from quickdraft.text import LINE_BREAK, unusable_reason

logger = logging.getLogger(__name__)

UTF8 = "utf-8"
UTF16 = "utf-16"
UTF32 = "utf-32"
ENCODINGS = (UTF8, UTF16, UTF32)


def units(text: str, encoding: str = UTF16) -> int:
    """Length of `text` in code units of `encoding`."""
    if encoding == UTF32 or text.isascii():
        return len(text)
    if encoding == UTF16:
        return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)
    return len(text.encode("utf-8", errors="surrogatepass"))


def _unit_width(ch: str, encoding: str) -> int:
    code = ord(ch)
    if encoding == UTF16:
        return 2 if code > 0xFFFF else 1
    if encoding == UTF8:
        if code < 0x80:
            return 1
        if code < 0x800:
            return 2
        return 3 if code < 0x10000 else 4
    return 1


def codepoint_column(
    line: str, character: int, encoding: str = UTF16, *, strict: bool = False
) -> int:
    """Code point index in `line` of the LSP column `character` (in `encoding` units).

    A column past the end of the line means the end of the line (the LSP rule), unless
    `strict`, when it raises PositionError. A column inside a character (half a surrogate
    pair) rounds down to that character's start.
    """
    if character < 0:
        raise PositionError(f"character {character} is negative")
    if encoding == UTF32 or line.isascii():
        if character > len(line):
            if strict:
                raise PositionError(
                    f"character {character} is past the end of the line ({len(line)})"
                )
            return len(line)
        return character
    count = 0
    for index, ch in enumerate(line):
        width = _unit_width(ch, encoding)
        if count + width > character:
            return index
        count += width
    if character > count and strict:
        raise PositionError(f"character {character} is past the end of the line ({count})")
    return len(line)


def lsp_column(line: str, column: int, encoding: str = UTF16) -> int:
    """LSP column (in `encoding` units) of code point index `column` in `line`."""
    return units(line[:column], encoding)


@dataclass
class Document:
    uri: str
    text: str
    language_id: str = ""
    version: int = 0
    encoding: str = UTF16
    edited_at: int | None = None
    """The offset (code points) just after the last edit."""
    cursor_at: int | None = None
    """Where the cursor was last seen (code points): the end of the last edit, the position of
    the last `textDocument/didFocus` or completion request, whichever came last; None when
    nothing has said (then warm-up computes only the file-level part of the prompt)."""
    _line_starts: list[int] | None = field(default=None, repr=False, compare=False)

    # --- lines -------------------------------------------------------------------------

    @property
    def line_starts(self) -> list[int]:
        """Offset (code points) where each line begins (kept up to date edit by edit)."""
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in LINE_BREAK.finditer(self.text)]
        return self._line_starts

    @property
    def line_count(self) -> int:
        return len(self.line_starts)

    def line_text(self, line: int) -> str:
        """Line `line` without its line break."""
        starts = self.line_starts
        start = starts[line]
        end = starts[line + 1] if line + 1 < len(starts) else len(self.text)
        text = self.text[start:end]
        if text.endswith("\r\n"):
            return text[:-2]
        if text.endswith(("\n", "\r")):
            return text[:-1]
        return text

    # --- positions ---------------------------------------------------------------------

    def to_codepoint(self, line: int, character: int, *, strict: bool = True) -> int:
        """Code point column on `line` of the LSP position (line, character).

        strict: positions outside the document raise PositionError (requests).
        Otherwise they are clamped as the LSP specification says (edits).
        """
        if line < 0:
            raise PositionError(f"line {line} is negative")
        if line >= self.line_count:
            if strict:
                raise PositionError(
                    f"line {line} is past the end of the document ({self.line_count} lines)"
                )
            line = self.line_count - 1
            return len(self.line_text(line))
        return codepoint_column(self.line_text(line), character, self.encoding, strict=strict)

    def offset_at(self, line: int, character: int, *, strict: bool = True) -> int:
        """Offset (code points) into `text` of the LSP position (line, character)."""
        if line >= self.line_count and not strict:
            return len(self.text)
        column = self.to_codepoint(line, character, strict=strict)
        return self.line_starts[line] + column

    def from_codepoint(self, line: int, column: int) -> int:
        """LSP character (in the document's encoding) of code point `column` on `line`."""
        return lsp_column(self.line_text(line), column, self.encoding)

    def line_column(self, offset: int) -> tuple[int, int]:
        """(line, column in code points) of the code point `offset` into `text`."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.line_starts, offset) - 1
        return line, min(offset - self.line_starts[line], len(self.line_text(line)))

    def position_at(self, offset: int) -> tuple[int, int]:
        """LSP (line, character) of the code point `offset` into `text`."""
        line, column = self.line_column(offset)
        return line, self.from_codepoint(line, column)

    # --- edits -------------------------------------------------------------------------

    def apply_change(self, text: str, range_: tuple[int, int, int, int] | None = None) -> None:
        """Replace `range_` (start line, start character, end line, end character, in LSP
        units) with `text`; no range replaces the whole document.

        The line index is updated around the edit, not rebuilt: a keystroke in a large file
        re-reads a line or two (plus shifting the later line starts by the length change).
        """
        if range_ is None:
            self.text = text
            self._line_starts = None
            self.edited_at = None
            self.cursor_at = None
            return
        start, end = self.span(range_)
        old = self.text
        self.text = old[:start] + text + old[end:]
        self._update_line_starts(start, end, len(text), old)
        self.edited_at = start + len(text)
        self.cursor_at = self.edited_at

    def span(self, range_: tuple[int, int, int, int]) -> tuple[int, int]:
        """(start, end) offsets (code points) of an edit's LSP range, clamped as the LSP
        specification says, in order."""
        start = self.offset_at(range_[0], range_[1], strict=False)
        end = self.offset_at(range_[2], range_[3], strict=False)
        return (start, end) if start <= end else (end, start)

    def _update_line_starts(self, start: int, end: int, inserted: int, old: str) -> None:
        starts = self.line_starts if self._line_starts is not None else None
        if starts is None:
            return
        # Lines from the one holding `start` (one more back: a "\r" before it may now pair
        # with an inserted "\n") to the one holding `end` are re-read.
        first = max(bisect.bisect_right(starts, start) - 2, 0)
        last = bisect.bisect_right(starts, end)  # first line start after the edit
        if last < len(starts) and starts[last] <= end + 1:
            last += 1  # an "\r\n" split by the edit
        region_start = starts[first]
        delta = inserted - (end - start)
        region_end_old = starts[last] if last < len(starts) else len(old)
        region_end_new = region_end_old + delta
        found = [
            m.end() + region_start
            for m in LINE_BREAK.finditer(self.text[region_start:region_end_new])
        ]
        # A break ending exactly at the region's end is the next line's start, kept below.
        found = [pos for pos in found if pos < region_end_new or last >= len(starts)]
        tail = [pos + delta for pos in starts[last:]]
        self._line_starts = starts[: first + 1] + found + tail
        if tail and found and found[-1] == tail[0]:
            self._line_starts = starts[: first + 1] + found[:-1] + tail

    # --- usability ---------------------------------------------------------------------

    def unusable_reason(self, max_bytes: int) -> str | None:
        """Why this document cannot be completed (too large, binary), or None."""
        return unusable_reason(self.text, max_bytes)


class DocumentStore:
    """Open documents by URI. Lives on the event loop; the model worker gets snapshots.

    `history` records every change applied here, in order (context.edit_history): the recent
    edits a next-edit prompt shows come from the very changes that made the text."""

    def __init__(self, encoding: str = UTF16, history: EditHistory | None = None):
        self.encoding = encoding
        self._documents: dict[str, Document] = {}
        self.history = history or EditHistory()

    def __contains__(self, uri: str) -> bool:
        return uri in self._documents

    def __len__(self) -> int:
        return len(self._documents)

    def uris(self) -> list[str]:
        return list(self._documents)

    def get(self, uri: str) -> Document | None:
        return self._documents.get(uri)

    def versions(self) -> tuple[tuple[str, int], ...]:
        """Every open document's (uri, version): what something made from all of them (a next
        edit decided ahead) was made at."""
        return tuple((uri, document.version) for uri, document in self._documents.items())

    def open(self, uri: str, text: str, language_id: str = "", version: int = 0) -> Document:
        """Open (or reopen: its history starts again) a document."""
        self.history.forget(uri)
        document = Document(uri, text, language_id, version, self.encoding)
        self._documents[uri] = document
        return document

    def change(
        self,
        uri: str,
        changes: list[tuple[str, tuple[int, int, int, int] | None]],
        version: int | None = None,
    ) -> Document:
        """Apply content changes in order; raises KeyError for a document that is not open."""
        document = self._documents[uri]
        for text, range_ in changes:
            if range_ is None:
                before = document.text
                document.apply_change(text, None)
                self._record(document, self.history.record_full, uri, before, text)
                continue
            start, end = document.span(range_)
            line, block_start, block_end = lines_touched(
                document.text, document.line_starts, start, end
            )
            old = document.text[block_start:block_end]
            document.apply_change(text, range_)
            new_end = block_end + len(text) - (end - start)
            new = document.text[block_start:new_end]
            self._record(document, self.history.record, uri, block_start, line, old, new)
        if version is not None:
            document.version = version
        return document

    def _record(self, document: Document, record, *args) -> None:
        # The change is applied already: whatever the history does, the text stays right.
        try:
            record(*args)
        except Exception:  # pragma: no cover - a bug in the history must not lose an edit
            logger.exception("edit history: could not record a change to %s", document.uri)

    def close(self, uri: str) -> Document | None:
        self.history.forget(uri)
        return self._documents.pop(uri, None)


def completion_request(
    uri: str,
    language_id: str | None,
    text: str,
    offset: int,
    line: int,
    column: int,
    *,
    slot: str | None = None,
    floor: float = 0.0,
) -> CompletionRequest:
    """The Completer's request for a place in a document (`column` in code points); `floor`
    its `min_confidence`."""
    return CompletionRequest(
        uri=uri,
        text=text,
        line=line,
        character=column,
        language_id=language_id,
        offset=offset,
        slot=slot,
        min_confidence=floor,
    )


def next_edit_request(
    store: DocumentStore, document: Document, offset: int, history_files: int
) -> NextEditRequest:
    """The next-edit pipeline's request for a place in `document` (`offset` in code points):
    its text, and its recent edits and those of the `history_files` other documents edited
    last (`EditHistory.recent`)."""
    line, column = document.line_column(offset)
    own, others = store.history.recent(document.uri, history_files)
    last = store.history.last_edited()
    return NextEditRequest(
        document.uri,
        document.text,
        line,
        column,
        document.language_id,
        offset,
        own,
        others,
        edited_elsewhere_since=last is not None and last != document.uri,
    )
