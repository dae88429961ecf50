"""The open documents as n-gram sources (document_index.DocumentIndex), through what it hands
its n-gram index: sources named `<uri>#...`, each the tokens of one chunk."""

from __future__ import annotations

from quickdraft.context import OpenDocument
from quickdraft.decoding.ngram import NgramIndex
from quickdraft.document_index import DocumentIndex


def ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class Sources:
    """An n-gram index that only holds what it is given."""

    def __init__(self):
        self.held: dict[str, list[int]] = {}

    def set_source(self, name, tokens):
        self.held[name] = list(tokens)

    def remove_source(self, name):
        self.held.pop(name, None)

    def of(self, uri: str) -> dict[str, str]:
        return {
            name: bytes(tokens).decode("utf-8")
            for name, tokens in self.held.items()
            if name.startswith(uri + "#")
        }


Y = "file:///work/y.py"
X = "file:///work/x.py"


def test_a_document_is_indexed_replaced_and_removed():
    sources = Sources()
    index = DocumentIndex(sources, ids)
    index.update(Y, "print('hello')\n")
    [(name, chunk)] = sources.of(Y).items()
    assert chunk == "print('hello')\n"
    index.update(Y, "print('hello world')\n")
    assert name not in sources.held
    assert "".join(sources.of(Y).values()) == "print('hello world')\n"
    index.remove(Y)
    assert sources.of(Y) == {}


def test_the_current_document_is_split_at_the_cursor_and_whole_again_after():
    """Indexed whole, the text before the cursor would match itself and propose what follows
    the cursor; split, a lookup on it finds the other file's continuation."""
    text = "def sub(a, b):\n    return a - b\n\nvalue = sub(3, 1)\nother = sub(\n"
    cursor = text.index("other = sub(") + len("other = sub(")
    ngram = NgramIndex()
    index = DocumentIndex(ngram, ids)
    index.update("file:///work/z.py", "other = sub(9, 4)\n")
    index.update(X, text, cursor)
    halves = {name[-1]: chunk for name, chunk in _texts(ngram, X).items()}
    assert halves["<"].endswith("other = sub(") and halves[">"] == "\n"
    assert "".join(_texts(ngram, X).values()) == text
    match = ngram.lookup(ids("other = sub("), 4)
    assert match is not None and match.source.startswith("file:///work/z.py")
    index.update(X, text)  # no longer the request's document
    assert all(not name.endswith(("<", ">")) for name in _texts(ngram, X))
    assert "".join(_texts(ngram, X).values()) == text


def _texts(ngram: NgramIndex, uri: str) -> dict[str, str]:
    from quickdraft.testing import ngram_source_tokens

    return {
        name: bytes(ngram_source_tokens(ngram, name)).decode("utf-8")
        for name in ngram.sources
        if name.startswith(uri + "#")
    }


def test_the_local_backend_indexes_no_binary_document():
    from quickdraft.config import load_config
    from quickdraft.local_backend import LocalBackend
    from quickdraft.testing import build_tiny_loaded_models

    backend = LocalBackend(build_tiny_loaded_models(), load_config({}))
    blob, good = "file:///work/blob.bin", "file:///work/good.py"
    documents = {
        blob: OpenDocument("blob.bin", "\x00\x01\x02"),
        good: OpenDocument("good.py", "x = 1\n", "python"),
    }
    backend.index_documents(documents, None)
    names = backend.engine.ngram.sources
    assert any(n.startswith(good + "#") for n in names)
    assert not any(n.startswith(blob + "#") for n in names)
