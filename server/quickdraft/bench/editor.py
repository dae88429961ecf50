"""The editor's side of the typing bench's LSP conversation: its copy of an open document,
whose edits become VS Code's `didChange` (UTF-16 ranges, versions), and the inline completion
request and answer as VS Code sends and reads them."""

from __future__ import annotations

from typing import Any

from quickdraft.lsp.documents import UTF16, Document, units


class EditorDocument:
    """The editor's copy of one open document; every edit becomes VS Code's didChange."""

    def __init__(self, uri: str, language: str, text: str) -> None:
        self.document = Document(uri, text, language, 1, UTF16)

    @property
    def uri(self) -> str:
        return self.document.uri

    @property
    def text(self) -> str:
        return self.document.text

    def position(self, offset: int) -> dict[str, int]:
        line, character = self.document.position_at(offset)
        return {"line": line, "character": character}

    def offset(self, position: dict[str, int]) -> int:
        return self.document.offset_at(position["line"], position["character"], strict=False)

    def did_open(self) -> dict[str, Any]:
        doc = self.document
        return {
            "textDocument": {
                "uri": doc.uri,
                "languageId": doc.language_id,
                "version": doc.version,
                "text": doc.text,
            }
        }

    def edit(self, start: int, end: int, text: str) -> dict[str, Any]:
        """Replace `start`..`end` (code point offsets) with `text`: the didChange params."""
        replaced = self.text[start:end]
        change = {
            "range": {"start": self.position(start), "end": self.position(end)},
            "rangeLength": units(replaced),
            "text": text,
        }
        self.document.text = self.text[:start] + text + self.text[end:]
        self.document._line_starts = None
        self.document.version += 1
        return {
            "textDocument": {"uri": self.uri, "version": self.document.version},
            "contentChanges": [change],
        }


def inline_params(doc: EditorDocument, offset: int) -> dict[str, Any]:
    """`textDocument/inlineCompletion` as VS Code sends it while the user types."""
    return {
        "context": {"triggerKind": 2},  # InlineCompletionTriggerKind.Automatic
        "textDocument": {"uri": doc.uri},
        "position": doc.position(offset),
    }


def first_item(result: Any) -> dict[str, Any] | None:
    items = result.get("items") if isinstance(result, dict) else result
    if not items:
        return None
    item = items[0]
    return item if isinstance(item, dict) else None


def item_text(item: dict[str, Any]) -> str:
    text = item.get("insertText", "")
    return text.get("value", "") if isinstance(text, dict) else str(text or "")
