"""What the person changed lately, per document: the edits a next-edit prompt shows.

The language server's document store hands every change it applies to `EditHistory`, in
order, as the whole lines the change touched before and after it (`record`), or, for a
full-text sync, the two texts (`record_full`, which diffs them line by line). Consecutive
changes on the same or adjacent lines coalesce into one `Hunk` (typing a word is one hunk, not
one per keystroke), so the prompt sees "renamed `a` to `b` on line 3", not thirty keystrokes.
A change elsewhere starts a new hunk; a hunk whose text comes back to what it was (typed,
then deleted) is dropped.

Each document keeps at most `max_hunks` hunks and `max_bytes` of their text, the oldest going
first. `recent` gives a document's hunks and those of the `files` other documents edited most
recently. A closed document's history is dropped (`forget`).

Offsets are code points into the document's text, as everywhere outside lsp/documents.py.
Nothing here touches the document: the store applies the change, then tells the history.
"""

from __future__ import annotations

import bisect
import difflib
import re
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from quickdraft.text import LINE_BREAK

MERGE_LIMIT_SHARE = 4
"""Changes stop coalescing into a hunk once it holds 1/MERGE_LIMIT_SHARE of `max_bytes`: a
long session on one function still leaves a few hunks, not one that says "rewrote it"."""


@dataclass(frozen=True)
class Hunk:
    """One coalesced edit: whole lines of a document before and after it."""

    uri: str
    start: int
    """Offset (code points) of the hunk's first line in the document just after the hunk's
    last change (later hunks elsewhere may have moved it since)."""
    start_line: int
    """0-based line the hunk starts at (before and after: the lines above it did not change)."""
    old: str
    """The lines as they were, line breaks included (empty: lines were inserted)."""
    new: str
    """The lines as they are after the hunk (empty: lines were deleted)."""

    @property
    def end(self) -> int:
        """Offset just after the hunk's new text, in the document just after it."""
        return self.start + len(self.new)

    @property
    def size(self) -> int:
        """Bytes of text the hunk holds (old and new), as `max_bytes` counts them."""
        return len(self.old.encode("utf-8", "surrogatepass")) + len(
            self.new.encode("utf-8", "surrogatepass")
        )

    @property
    def old_lines(self) -> list[str]:
        return lines_with_breaks(self.old)

    @property
    def new_lines(self) -> list[str]:
        return lines_with_breaks(self.new)


def lines_with_breaks(text: str) -> list[str]:
    """`text` as lines, each with its break (LSP's: \\r\\n, \\r, \\n); a last line without
    one as it is. Joined, they give `text`."""
    if not text:
        return []
    out, start = [], 0
    for match in LINE_BREAK.finditer(text):
        out.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        out.append(text[start:])
    return out


_HEADER = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def unified_diff(hunk: Hunk, path: str, context: int = 0) -> str:
    """The hunk as a unified diff (difflib) of `path`, line numbers as in the document; empty
    when nothing changed. `context`: unchanged lines shown around each change."""
    old, new = hunk.old_lines, hunk.new_lines
    produced = list(
        difflib.unified_diff(old, new, fromfile=path, tofile=path, n=context, lineterm="")
    )
    # The two file lines, then hunk headers and lines that carry their own line breaks.
    lines = produced[:2] + [line.rstrip("\r\n") for line in produced[2:]]
    if not lines:
        return ""
    shift = hunk.start_line

    def moved(match: re.Match) -> str:
        old_start, old_count = int(match.group(1)), match.group(2) or ""
        new_start, new_count = int(match.group(3)), match.group(4) or ""
        # difflib numbers an empty side from 0 (the line before it), like diff -U
        return f"@@ -{old_start + shift}{old_count} +{new_start + shift}{new_count} @@"

    return "\n".join(_HEADER.sub(moved, line) if line.startswith("@@") else line for line in lines)


class EditHistory:
    """Recent hunks of every open document, and the order documents were edited in."""

    def __init__(self, max_hunks: int = 16, max_bytes: int = 16384) -> None:
        self.max_hunks = max_hunks
        self.max_bytes = max_bytes
        self._hunks: OrderedDict[str, deque[Hunk]] = OrderedDict()
        """uri -> its hunks, oldest first; documents least recently edited first."""
        self.recorded = 0
        """Changes recorded (tests count them)."""

    def configure(self, max_hunks: int, max_bytes: int) -> None:
        self.max_hunks, self.max_bytes = max_hunks, max_bytes
        for uri in list(self._hunks):
            self._trim(uri)

    # --- recording ------------------------------------------------------------------

    def record(self, uri: str, start: int, start_line: int, old: str, new: str) -> None:
        """One change, as the whole lines it touched: `old` (from offset `start`, line
        `start_line`, of the text before the change) became `new`."""
        self.recorded += 1
        if old == new:
            return
        hunks = self._hunks.setdefault(uri, deque())
        self._hunks.move_to_end(uri)
        last = hunks[-1] if hunks else None
        end = start + len(old)
        if last is not None and start <= last.end and end >= last.start:
            merged = self._merge(last, start, start_line, old, new)
            if merged is not None:
                hunks.pop()
                if merged.old != merged.new:
                    hunks.append(merged)
                self._trim(uri)
                return
        hunks.append(Hunk(uri, start, start_line, old, new))
        self._trim(uri)

    def _merge(self, last: Hunk, start: int, start_line: int, old: str, new: str) -> Hunk | None:
        """`last` and a change that overlaps or touches its new lines, as one hunk; None when
        the result would be too large to stay one."""
        # The change's lines and the hunk's new lines, in the text before the change: the
        # union is what the merged hunk covers. Outside the hunk the text is as it was.
        first = min(start, last.start)
        end = max(start + len(old), last.end)
        if start <= last.start:
            before_hunk = old[: last.start - start]
            line = start_line
        else:
            before_hunk = ""
            line = last.start_line
        after_hunk = old[len(old) - (end - last.end) :] if end > last.end else ""
        original = before_hunk + last.old + after_hunk
        # The current text of the union: the change's new lines, with the parts of the hunk's
        # new text the change did not cover on either side.
        lead = last.new[: start - last.start] if start > last.start else ""
        tail = (
            last.new[len(last.new) - (last.end - start - len(old)) :]
            if end > start + len(old)
            else ""
        )
        current = lead + new + tail
        merged = Hunk(last.uri, first, line, original, current)
        if merged.size > max(self.max_bytes // MERGE_LIMIT_SHARE, 1) and merged.old != merged.new:
            return None
        return merged

    def record_full(self, uri: str, before: str, after: str) -> None:
        """A full-text sync: the line-level differences of the two texts, as changes."""
        if before == after:
            self.recorded += 1
            return
        old_lines, new_lines = lines_with_breaks(before), lines_with_breaks(after)
        # Common ends first: difflib then compares only the lines that differ.
        head = 0
        while head < min(len(old_lines), len(new_lines)) and old_lines[head] == new_lines[head]:
            head += 1
        tail = 0
        while (
            tail < min(len(old_lines), len(new_lines)) - head
            and old_lines[-1 - tail] == new_lines[-1 - tail]
        ):
            tail += 1
        old_mid = old_lines[head : len(old_lines) - tail]
        new_mid = new_lines[head : len(new_lines) - tail]
        offset = sum(map(len, old_lines[:head]))
        shift = 0  # how far the changes recorded so far moved the later text
        matcher = difflib.SequenceMatcher(None, old_mid, new_mid, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            start = offset + sum(map(len, old_mid[:i1])) + shift
            old = "".join(old_mid[i1:i2])
            new = "".join(new_mid[j1:j2])
            # The changes above are recorded already: the lines before this one are the new ones.
            self.record(uri, start, head + j1, old, new)
            shift += len(new) - len(old)

    # --- reading --------------------------------------------------------------------

    def hunks(self, uri: str) -> list[Hunk]:
        """`uri`'s hunks, oldest first."""
        return list(self._hunks.get(uri, ()))

    def recent(self, uri: str, files: int) -> tuple[list[Hunk], list[Hunk]]:
        """(`uri`'s hunks, the hunks of the `files` other documents edited most recently), each
        oldest first; the others' in the order their documents were last edited."""
        others: list[list[Hunk]] = []
        for other in reversed(self._hunks):
            if len(others) >= files:
                break
            if other != uri and self._hunks[other]:
                others.append(list(self._hunks[other]))
        return self.hunks(uri), [h for group in reversed(others) for h in group]

    def last_edited(self) -> str | None:
        """The document edited last (of those with hunks kept)."""
        return next(reversed(self._hunks), None)

    def forget(self, uri: str) -> None:
        """A closed document: its history goes."""
        self._hunks.pop(uri, None)

    def __contains__(self, uri: str) -> bool:
        return bool(self._hunks.get(uri))

    # --- bounds ---------------------------------------------------------------------

    def _trim(self, uri: str) -> None:
        hunks = self._hunks.get(uri)
        if hunks is None:
            return
        total = sum(h.size for h in hunks)
        while hunks and (len(hunks) > self.max_hunks or total > self.max_bytes):
            total -= hunks.popleft().size
        if not hunks:
            del self._hunks[uri]


def lines_touched(
    text: str, line_starts: Sequence[int], start: int, end: int
) -> tuple[int, int, int]:
    """(first line, its offset, the offset after the last line, its break included) of the
    lines of `text` (beginning at `line_starts`) that the span `start`..`end` touches."""
    first = max(bisect.bisect_right(line_starts, start) - 1, 0)
    last = max(bisect.bisect_right(line_starts, end) - 1, first)
    block_end = line_starts[last + 1] if last + 1 < len(line_starts) else len(text)
    return first, line_starts[first], block_end
