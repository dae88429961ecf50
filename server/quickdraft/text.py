"""Text rules every layer shares: what a line break is, which documents can be completed, and
how a source file is read as text (`read_text_file`: the CLI and the bench).

Lines end at `\\r\\n`, `\\r` or `\\n`, as the LSP specification says. A document is unusable
for completion when it is larger than `context.max_document_bytes` (in UTF-8) or holds a NUL
(binary content); the language server, the Completer and snippet selection all ask
`unusable_reason`, so they always agree.
"""

from __future__ import annotations

import re
from pathlib import Path

from quickdraft.errors import InputError

LINE_BREAK = re.compile(r"\r\n|\r|\n")
"""One line break (LSP: CRLF, CR or LF)."""
LINE_SPLIT = re.compile(r"(\r\n|\r|\n)")
"""`LINE_SPLIT.split(text)` alternates line contents and their breaks."""


def without_lone_surrogates(text: str) -> str:
    """`text` with each lone UTF-16 surrogate (which JSON can carry, and no tokenizer can
    encode) replaced by U+FFFD: one code point for one, so every offset stays where it was."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def split_lines(text: str) -> tuple[list[str], list[str]]:
    """(line contents, line endings) with LSP's line breaks: \\r\\n, \\r and \\n."""
    if "\r" not in text:
        contents = text.split("\n")
        endings = ["\n"] * (len(contents) - 1) + [""]
        return contents, endings
    parts = LINE_SPLIT.split(text)
    return parts[0::2], parts[1::2] + [""]


def position_after(line: int, column: int, inserted: str) -> tuple[int, int]:
    """The (line, column) just past `inserted` written at (`line`, `column`): code points,
    LSP's line breaks."""
    lines, _ = split_lines(inserted)
    if len(lines) == 1:
        return line, column + len(lines[0])
    return line + len(lines) - 1, len(lines[-1])


def too_large(text: str, max_bytes: int) -> bool:
    """Whether `text` takes more than `max_bytes` in UTF-8 (without encoding it when the code
    point count alone decides: UTF-8 takes 1 to 4 bytes a code point)."""
    if len(text) > max_bytes:
        return True
    if len(text) * 4 <= max_bytes:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > max_bytes


def unusable_reason(text: str, max_bytes: int) -> str | None:
    """Why a document cannot be completed in or used as context, or None."""
    if too_large(text, max_bytes):
        return f"document is larger than context.max_document_bytes ({max_bytes} bytes)"
    if "\x00" in text:
        return "document contains NUL bytes (binary content)"
    return None


def read_text_file(path: Path) -> str:
    """A source file's text; InputError saying why it is none (missing, a directory,
    unreadable, binary: NUL bytes, not UTF-8)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if b"\x00" in data:
        raise InputError(f"{path}: looks binary (contains NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
