"""Open documents as n-gram sources, updated by what changed, never by re-reading everything.

Each document is cut into chunks of lines at content-defined boundaries (a chunk ends after a
line whose hash says so, or after MAX_CHUNK_LINES lines), so an edit changes the chunk it is in
and leaves the others as they were. A chunk's tokens are remembered by its text (the
Completer's TokenCache) and each chunk is an n-gram source of its own: after a keystroke only
the edited chunk is tokenized and indexed again.

Only a window of each document is indexed: WINDOW_CHARS around the cursor in the document
being completed, the first OTHER_DOCUMENT_CHARS of the others. A 2 MB file costs what a small
one does.

The chunk holding the cursor is indexed as two sources split at the cursor: whole, the text
before the cursor would match itself and propose the text after it, shadowing real matches.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quickdraft.decoding.ngram import NgramIndex
from quickdraft.text import LINE_BREAK

WINDOW_CHARS = 32_000
"""Characters indexed on each side of the cursor in the document being completed."""
OTHER_DOCUMENT_CHARS = 96_000
"""Characters indexed from the start of every other open document."""
MIN_CHUNK_LINES = 8
MAX_CHUNK_LINES = 64
BOUNDARY_MODULUS = 8
"""A line whose crc32 is 0 modulo this ends a chunk (once it has MIN_CHUNK_LINES lines)."""


def chunk_lines(lines: Sequence[str]) -> list[str]:
    """The texts of the chunks `lines` (each with its line break) are cut into."""
    chunks: list[str] = []
    current: list[str] = []
    for line in lines:
        current.append(line)
        size = len(current)
        if size >= MAX_CHUNK_LINES or (
            size >= MIN_CHUNK_LINES
            and zlib.crc32(line.encode("utf-8", "surrogatepass")) % BOUNDARY_MODULUS == 0
        ):
            chunks.append("".join(current))
            current = []
    if current:
        chunks.append("".join(current))
    return chunks


def _lines(text: str) -> list[str]:
    """`text` in lines, each with its line break."""
    out = []
    start = 0
    for match in LINE_BREAK.finditer(text):
        out.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        out.append(text[start:])
    return out


def _window(text: str, cursor: int | None) -> tuple[str, int | None]:
    """The indexed part of a document, aligned to line starts, and the cursor's offset in it."""
    if cursor is None:
        if len(text) <= OTHER_DOCUMENT_CHARS:
            return text, None
        end = text.rfind("\n", 0, OTHER_DOCUMENT_CHARS) + 1 or OTHER_DOCUMENT_CHARS
        return text[:end], None
    start = max(0, cursor - WINDOW_CHARS)
    if start:
        start = text.rfind("\n", 0, start) + 1
    end = min(len(text), cursor + WINDOW_CHARS)
    if end < len(text):
        end = text.rfind("\n", cursor, end) + 1 or end
    return text[start:end], cursor - start


@dataclass
class _Indexed:
    sources: dict[str, str] = field(default_factory=dict)
    """n-gram source name -> its text."""


class DocumentIndex:
    """The open documents' chunks in an `NgramIndex`. Not thread-safe: the worker owns it."""

    def __init__(self, ngram: NgramIndex, ids: Callable[[str], Sequence[int]]):
        self.ngram = ngram
        self.ids = ids
        """Text -> token ids (the Completer's cached tokenizer)."""
        self._documents: dict[str, _Indexed] = {}
        self.indexed_tokens = 0
        """Tokens handed to the n-gram index so far (tests count work with it)."""

    def update(self, uri: str, text: str, cursor: int | None = None) -> None:
        """Index `text` as the content of `uri`; `cursor`: the offset of the request's cursor
        when `uri` is the document being completed. Unchanged chunks cost nothing."""
        window, at = _window(text, cursor)
        wanted: dict[str, str] = {}
        position = 0
        for chunk in chunk_lines(_lines(window)):
            end = position + len(chunk)
            if at is not None and position <= at <= end:
                before, after = chunk[: at - position], chunk[at - position :]
                if before:
                    wanted[f"{uri}#{zlib.crc32(before.encode('utf-8', 'surrogatepass'))}<"] = before
                if after:
                    wanted[f"{uri}#{zlib.crc32(after.encode('utf-8', 'surrogatepass'))}>"] = after
                at = None  # the cursor's chunk is split once
            else:
                key = zlib.crc32(chunk.encode("utf-8", "surrogatepass"))
                wanted[f"{uri}#{key}:{len(chunk)}"] = chunk
            position = end
        known = self._documents.setdefault(uri, _Indexed())
        for name, chunk in list(known.sources.items()):
            if wanted.get(name) != chunk:
                self.ngram.remove_source(name)
                del known.sources[name]
        for name, chunk in wanted.items():
            if name not in known.sources:
                tokens = list(self.ids(chunk))
                self.indexed_tokens += len(tokens)
                self.ngram.set_source(name, tokens)
                known.sources[name] = chunk

    def remove(self, uri: str) -> None:
        known = self._documents.pop(uri, None)
        if known is not None:
            for name in known.sources:
                self.ngram.remove_source(name)

    def clear(self) -> None:
        for uri in list(self._documents):
            self.remove(uri)
