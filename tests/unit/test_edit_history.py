"""The edit history next-edit prompts show: hunks derived from the document store's changes."""

from __future__ import annotations

from quickdraft.context.edit_history import EditHistory, Hunk, unified_diff
from quickdraft.lsp.documents import DocumentStore

A, B, C, D = (f"file:///w/{name}.py" for name in "abcd")
TEXT = "def f(a):\n    return a\n\n\nx = f(1)\ny = f(2)\n"


def store_with(text: str = TEXT, uri: str = A) -> DocumentStore:
    store = DocumentStore()
    store.open(uri, text, "python", 1)
    return store


def type_at(store: DocumentStore, uri: str, line: int, character: int, text: str) -> None:
    """Type `text` one character at a time, as a client sends keystrokes."""
    for i, ch in enumerate(text):
        store.change(uri, [(ch, (line, character + i, line, character + i))])


def test_keystrokes_on_one_line_coalesce_into_one_hunk():
    store = store_with()
    type_at(store, A, 0, 7, "bc")  # def f(abc):
    store.change(A, [("", (0, 8, 0, 9))])  # Backspace: def f(ab):
    [hunk] = store.history.hunks(A)
    assert (hunk.old, hunk.new) == ("def f(a):\n", "def f(ab):\n")
    assert (hunk.start, hunk.start_line) == (0, 0)
    assert store.history.recorded == 3


def test_adjacent_lines_merge_and_distant_ones_start_a_new_hunk():
    store = store_with()
    type_at(store, A, 0, 7, "b")
    type_at(store, A, 1, 12, "b")  # the next line: the same hunk
    store.change(A, [("z", (5, 0, 5, 1))])  # y -> z, four lines below: a new hunk
    first, second = store.history.hunks(A)
    assert (first.old, first.new) == ("def f(a):\n    return a\n", "def f(ab):\n    return ab\n")
    assert (second.start_line, second.old, second.new) == (5, "y = f(2)\n", "z = f(2)\n")
    assert store.get(A).text[second.start : second.end] == second.new


def test_an_edit_typed_and_taken_back_leaves_no_hunk():
    store = store_with()
    type_at(store, A, 4, 8, "0")
    store.change(A, [("", (4, 8, 4, 9))])
    assert store.history.hunks(A) == []


def test_inserted_and_deleted_lines():
    store = store_with()
    store.change(A, [("    print(a)\n", (1, 0, 1, 0))])
    [hunk] = store.history.hunks(A)
    assert hunk.old == "    return a\n" and hunk.new == "    print(a)\n    return a\n"
    store.change(A, [("", (3, 0, 5, 0))])  # the two blank lines
    # Right below the insertion: the same hunk, now both changes (the lines each change
    # touched, the end's line included).
    [hunk] = store.history.hunks(A)
    assert hunk.old == "    return a\n\n\nx = f(1)\n"
    assert hunk.new == "    print(a)\n    return a\nx = f(1)\n"
    assert unified_diff(hunk, "a.py").splitlines()[2:] == [
        "@@ -1,0 +2 @@",
        "+    print(a)",
        "@@ -3,2 +3,0 @@",
        "-",
        "-",
    ]
    assert store.get(A).text == "def f(a):\n    print(a)\n    return a\nx = f(1)\ny = f(2)\n"


def test_a_full_text_sync_is_diffed_line_by_line():
    store = store_with()
    new = TEXT.replace("return a", "return a * 2").replace("y = f(2)", "y = f(3)")
    store.change(A, [(new, None)])
    hunks = store.history.hunks(A)
    assert [(h.start_line, h.old, h.new) for h in hunks] == [
        (1, "    return a\n", "    return a * 2\n"),
        (5, "y = f(2)\n", "y = f(3)\n"),
    ]
    text = store.get(A).text
    assert text == new and text[hunks[1].start : hunks[1].end] == "y = f(3)\n"


def test_several_changes_in_one_notification_are_recorded_in_order():
    store = store_with()
    # Applied in order: the second range is in the text the first one made.
    store.change(A, [("b", (0, 6, 0, 7)), ("b", (1, 11, 1, 12))], 2)
    assert store.get(A).text.startswith("def f(b):\n    return b\n")
    [hunk] = store.history.hunks(A)
    assert hunk.new == "def f(b):\n    return b\n" and hunk.old == "def f(a):\n    return a\n"


def test_bounds_drop_the_oldest_hunks():
    history = EditHistory(max_hunks=2, max_bytes=10_000)
    for i in range(4):
        history.record(A, i * 100, i * 10, f"old {i}\n", f"new {i}\n")
    assert [h.new for h in history.hunks(A)] == ["new 2\n", "new 3\n"]
    history.configure(max_hunks=10, max_bytes=12)  # each hunk holds 12 bytes
    assert [h.new for h in history.hunks(A)] == ["new 3\n"]
    history.configure(max_hunks=0, max_bytes=12)
    assert history.hunks(A) == [] and A not in history


def test_a_hunk_stops_growing_at_a_quarter_of_the_byte_bound():
    history = EditHistory(max_hunks=16, max_bytes=400)
    line = "x" * 40 + "\n"
    history.record(A, 0, 0, line, line.replace("x", "y", 1))
    history.record(A, len(line), 1, line, line.replace("x", "y", 1))  # merges: 164 bytes
    assert len(history.hunks(A)) == 2


def test_other_files_most_recently_edited_and_closed_ones_drop():
    store = store_with()
    for uri in (B, C, D):
        store.open(uri, "v = 1\n", "python", 1)
    for uri in (B, C, D):
        store.change(uri, [("2", (0, 4, 0, 5))])
    type_at(store, A, 0, 7, "b")
    own, others = store.history.recent(A, files=2)
    assert [h.uri for h in own] == [A]
    assert [h.uri for h in others] == [C, D]  # oldest first: the prompt reads them in order
    store.close(D)
    _, others = store.history.recent(A, files=2)
    assert [h.uri for h in others] == [B, C]
    store.open(B, "v = 1\n", "python", 1)  # reopened: its history starts again
    assert store.history.recent(A, files=3)[1] == store.history.hunks(C)


def test_unified_diff_shows_the_document_line_numbers():
    hunk = Hunk(A, 40, 4, "x = f(1)\n", "x = f(1)\nz = f(3)\n")
    assert unified_diff(hunk, "a.py", context=1) == (
        "--- a.py\n+++ a.py\n@@ -5 +5,2 @@\n x = f(1)\n+z = f(3)"
    )
    assert unified_diff(Hunk(A, 0, 0, "a\n", "a\n"), "a.py") == ""
