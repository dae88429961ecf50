"""The workspace head: the same chunks for every document, in a stable order."""

from __future__ import annotations

import pytest

from quickdraft.config import load_config
from quickdraft.context.workspace import WorkspaceHead, top_chunk
from quickdraft.decoding.runner import common_prefix_length
from quickdraft.generation import CompletionRequest
from quickdraft.testing import build_tiny_loaded_models, local_completer

BODY = "".join(f"def f_{i}(x):\n    return x + {i}\n\n" for i in range(60))


def test_top_chunk_takes_the_first_lines_without_blank_edges():
    text = "\n\nimport os\nimport re\n\n\ndef f():\n    pass\n"
    assert top_chunk(text, 6) == ("import os\nimport re", 2, 4)
    assert top_chunk("\n\n\n", 3) is None


def test_chunks_keep_the_order_files_were_first_seen_and_their_first_text():
    head = WorkspaceHead()
    for name in ("a", "b", "c"):
        head.add(name, f"{name}.py", f"# {name}\nx = 1\n", "python", lines=4, max_bytes=10**6)
    head.add("a", "a.py", "# a, edited\n", "python", lines=4, max_bytes=10**6)
    assert [s.path for s in head.snippets()] == ["a.py", "b.py", "c.py"]
    assert head.chunk_of("a").text == "# a\nx = 1"  # as first seen: edits do not move it
    head.remove("b")
    head.add("d", "d.py", "# d\n", "python", lines=4, max_bytes=10**6)
    assert [s.path for s in head.snippets()] == ["a.py", "c.py", "d.py"]
    head.add("bin", "bin.dat", "\x00\x01binary", None, lines=4, max_bytes=10**6)
    assert "bin" not in head


@pytest.fixture(scope="module")
def models():
    return build_tiny_loaded_models()


def test_every_document_starts_with_the_same_head_and_warm_up_computes_it_once(models):
    # The append layout: its file-level part is the head and the file's header alone (the
    # pinned layout adds the file's top: test_context_pinned.py).
    settings = {
        "decoding": {"max_new_tokens": 4},
        "context": {"snippet_lines": 3, "layout": "append"},
    }
    completer = local_completer(models, load_config(settings))
    uris = [f"file:///work/m{i}.py" for i in range(3)]
    texts = [BODY.replace("f_", f"g{i}_") for i in range(3)]
    for uri, text in zip(uris, texts, strict=True):
        completer.set_document(uri, text, "python")
    line = 3 * 58 + 1  # "    return x + 58", deep in each file: its own chunk stays in the head
    prepared = [
        completer.prepare(CompletionRequest(uri, text, line, 4, "python"))
        for uri, text in zip(uris, texts, strict=True)
    ]
    heads = [p.prompt.snippets for p in prepared]
    assert [s.path for s in heads[0]] == ["m0.py", "m1.py", "m2.py"]
    assert heads[0] == heads[1] == heads[2]
    leading = [completer.file_level_tokens(p.prompt) for p in prepared]
    shared = min(leading)
    assert shared > 0
    # The documents' prompts part only at their own header (`<|file_sep|>m0.py` / `m1.py`).
    header = len(completer.prompts.cache.ids("<|file_sep|>m0.py\n"))
    common = common_prefix_length(prepared[0].prompt_ids, prepared[1].prompt_ids)
    assert shared - header <= common < shared
    # The file-level part is where every request deep in the file starts, whatever the cursor.
    other = completer.prepare(CompletionRequest(uris[1], texts[1], 3 * 50, 0, "python"))
    assert other.prompt.prefix_start_line > 0
    assert other.prompt_ids[: leading[1]] == prepared[1].prompt_ids[: leading[1]]
    computed = completer.warm(CompletionRequest(uris[1], texts[1], 0, 0, "python"), file_level=True)
    assert computed == leading[1]
    # Warming again, or toward less than the cache holds, computes nothing and crops nothing.
    completer.complete(CompletionRequest(uris[1], texts[1], line, 4, "python"))
    held = len(completer.backend.engine.target.tokens)
    again = completer.warm(CompletionRequest(uris[1], texts[1], 0, 0, "python"), file_level=True)
    assert again == 0 and len(completer.backend.engine.target.tokens) == held


def test_a_short_file_is_not_shown_twice(models):
    completer = local_completer(models, load_config({"decoding": {"max_new_tokens": 4}}))
    completer.set_document("file:///work/other.py", BODY, "python")
    short = "def add(a, b):\n    return a + b\n"
    completer.set_document("file:///work/short.py", short, "python")
    prompt = completer.build_prompt(
        CompletionRequest("file:///work/short.py", short, 1, 4, "python")
    )
    assert prompt.text.count("def add(a, b)") == 1
    assert [s.path for s in prompt.snippets] == ["other.py"]


def test_the_cursor_head_is_still_available(models):
    config = load_config({"context": {"head": "cursor"}})
    completer = local_completer(models, config)
    # Like x.py, not the same (text the prompt holds already is never shown twice).
    completer.set_document("file:///work/other.py", BODY.replace("x + ", "x * "), "python")
    completer.set_document("file:///work/x.py", BODY, "python")
    prompt = completer.build_prompt(CompletionRequest("file:///work/x.py", BODY, 49, 4, "python"))
    paths = [s.path for s in prompt.snippets]
    # Windows of the other file, most like the code above the cursor; none of the file itself.
    assert paths and set(paths) == {"other.py"}
