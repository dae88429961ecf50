"""The prompt head a workspace's documents share (`context.head: workspace`).

With `context.head: cursor` each document's prompt starts with the windows of other files most
similar to the code above its cursor: the head differs from file to file and from spot to spot,
so the first request at a new spot recomputes it. With `workspace` every document's prompt starts
with the same text: the top of each open file (its imports and first definitions, where a file
says what it is about), in the order the files were first seen, the one being completed
included. Its KV cache is computed once and every document's cache starts from it (the runners
adopt another slot's prefix), so moving to another file computes only that file's own part.

Stability is the point. A file's chunk is taken when the file is first seen and kept as it was
until the file is closed (editing it does not move the head); a new file's chunk goes at the end,
so it changes only the head's tail. The head is cut to its budget by dropping whole chunks from
the end, which is stable too: the files seen first stay.

This is llama.vim's ring of chunks, simplified: it picks chunks where the person works and
evicts the oldest; here every open file contributes its top once.
"""

from __future__ import annotations

from collections import OrderedDict

from quickdraft.context.snippets import Snippet
from quickdraft.text import LINE_BREAK, unusable_reason

HEAD_CHUNK_CHARS = 4000
"""No chunk is longer than this many characters, whatever its lines (minified files)."""


def top_chunk(text: str, lines: int) -> tuple[str, int, int] | None:
    """(text, first line, end line) of the first `lines` lines of `text`, blank lines off both
    ends; None when they are all blank."""
    rows = LINE_BREAK.split(text[: HEAD_CHUNK_CHARS * 2], maxsplit=lines)[:lines]
    first, last = 0, len(rows)
    while first < last and not rows[first].strip():
        first += 1
    while last > first and not rows[last - 1].strip():
        last -= 1
    if first == last:
        return None
    chunk = "\n".join(rows[first:last])[:HEAD_CHUNK_CHARS]
    return chunk, first, last


class WorkspaceHead:
    """The chunks of the workspace head, one per open file, in the order the files were seen."""

    def __init__(self) -> None:
        self._chunks: OrderedDict[str, Snippet] = OrderedDict()
        self.changes = 0
        """How many times the head changed (a chunk added or removed); tests count them."""

    def add(
        self,
        uri: str,
        path: str,
        text: str,
        language_id: str | None,
        *,
        lines: int,
        max_bytes: int,
    ) -> None:
        """Take `uri`'s chunk, the first time the file is seen (later calls keep it as it was).
        Files quickdraft does not complete in (too large, binary) have none."""
        if uri in self._chunks or unusable_reason(text, max_bytes) is not None:
            return
        found = top_chunk(text, lines)
        if found is None:
            return
        chunk, first, end = found
        self._chunks[uri] = Snippet(path, chunk, first, end, 1.0, language_id)
        self.changes += 1

    def remove(self, uri: str) -> None:
        """A closed file leaves the head."""
        if self._chunks.pop(uri, None) is not None:
            self.changes += 1

    def clear(self) -> None:
        if self._chunks:
            self.changes += 1
        self._chunks.clear()

    def __contains__(self, uri: str) -> bool:
        return uri in self._chunks

    def __len__(self) -> int:
        return len(self._chunks)

    def chunk_of(self, uri: str) -> Snippet | None:
        return self._chunks.get(uri)

    def snippets(self) -> list[Snippet]:
        """The chunks in head order (the prompt cuts them to its budget from the end)."""
        return list(self._chunks.values())
