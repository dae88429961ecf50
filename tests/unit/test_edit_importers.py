"""Next edits in the documents that import what the latest edit changed
(context/edit_importers.py), and how the pipeline asks for them (next_edit.decide_importer):
the import of a renamed function, then its uses by the `import` rule; the calls of a function
that lost a parameter; nothing for a module of the same name elsewhere, or while the source
still binds the old name."""

from __future__ import annotations

import pytest

from quickdraft.context import OpenDocument, syntax
from quickdraft.context.edit_history import EditHistory
from quickdraft.context.edit_importers import importer_candidates, module_parts
from quickdraft.context.edit_rules import latest_edit
from quickdraft.context.edit_vetoes import applied
from quickdraft.lsp.documents import DocumentStore, next_edit_request
from quickdraft.next_edit import decide, decide_importer

pytestmark = pytest.mark.skipif(
    syntax.tree_sitter_language("python") is None, reason="the Python grammar is not installed"
)

SOURCE_URI = "file:///ws/ledger/rows.py"
SOURCE = '''"""Rows of the ledger, read in pages."""

PAGE = 500


def fetch_rows(conn, table, limit):
    """Up to `limit` rows of `table`."""
    cursor = conn.execute(f"SELECT * FROM {table} LIMIT ?", (limit,))
    return cursor.fetchall()


class RowCache:
    def __init__(self, conn):
        self.conn = conn
        self.rows = {}

    def get(self, table):
        if table not in self.rows:
            self.rows[table] = fetch_rows(self.conn, table, PAGE)
        return self.rows[table]
'''

IMPORTER_URI = "file:///ws/ledger/report.py"
IMPORTER = """from collections import Counter

from . import rows
from .rows import RowCache, fetch_rows
from archive.rows import fetch_rows as fetch_archived


def summary(conn, table):
    counts = Counter(row[0] for row in fetch_rows(conn, table, 100))
    latest = rows.fetch_rows(conn, table, limit=10)
    return counts, latest, fetch_archived(conn, table, 5)


def cached(conn):
    return RowCache(conn)
"""


def edit_of(uri: str, before: str, after: str):
    history = EditHistory()
    history.record_full(uri, before, after)
    return latest_edit(uri, after, history.hunks(uri), "python")


def lines(text: str, candidates) -> list[tuple[int, str, str]]:
    """(1-based line, the text replaced, the new text) of each candidate."""
    return [
        (
            text.count("\n", 0, c.edit.start) + 1,
            text[c.edit.start : c.edit.end],
            c.edit.text,
        )
        for c in candidates
    ]


def test_module_paths_of_files_and_packages():
    assert module_parts("file:///ws/ledger/rows.py") == ("ws", "ledger", "rows")
    assert module_parts("file:///ws/ledger/__init__.py") == ("ws", "ledger")
    assert module_parts("file:///ws/ledger/rows.py", package=True) == ("ws", "ledger")
    assert module_parts("file:///ws/notes.txt") is None
    assert module_parts("untitled:Untitled-1") is None


def test_a_renamed_function_renames_its_import_and_module_reads_not_another_modules():
    after = SOURCE.replace("def fetch_rows(", "def load_rows(")
    edit = edit_of(SOURCE_URI, SOURCE, after)
    found = importer_candidates(edit, IMPORTER_URI, IMPORTER)
    assert lines(IMPORTER, found) == [
        (4, "fetch_rows", "load_rows"),  # from .rows import RowCache, fetch_rows
        (10, "fetch_rows", "load_rows"),  # rows.fetch_rows(...)
    ]
    assert {c.rule for c in found} == {"rename"}
    assert "rows.py" in found[0].note  # line 5's `archive.rows` is another module


def test_the_rename_is_found_after_its_uses_in_the_source_were_renamed_too():
    """The person renamed the def, then Tab applied its use in RowCache.get: the source's latest
    hunk is that use; the rename is the hunk before it."""
    renamed = SOURCE.replace("def fetch_rows(", "def load_rows(")
    history = EditHistory()
    history.record_full(SOURCE_URI, SOURCE, renamed)
    after = renamed.replace("= fetch_rows(self.conn", "= load_rows(self.conn")
    history.record_full(SOURCE_URI, renamed, after)
    edit = latest_edit(SOURCE_URI, after, history.hunks(SOURCE_URI), "python")
    assert edit is not None and "self.conn" in edit.new and len(edit.earlier) == 1
    found = importer_candidates(edit, IMPORTER_URI, IMPORTER)
    assert lines(IMPORTER, found) == [
        (4, "fetch_rows", "load_rows"),
        (10, "fetch_rows", "load_rows"),
    ]


def test_nothing_while_the_source_still_binds_the_old_name():
    after = SOURCE.replace("def fetch_rows(", "def load_rows(") + "\n\nfetch_rows = load_rows\n"
    history = EditHistory()
    history.record_full(SOURCE_URI, SOURCE, SOURCE.replace("def fetch_rows(", "def load_rows("))
    history.record_full(
        SOURCE_URI, SOURCE.replace("def fetch_rows(", "def load_rows("), after
    )  # an alias kept for old callers, then the def renamed last
    hunks = history.hunks(SOURCE_URI)
    hunks = [hunks[1], hunks[0]]
    edit = latest_edit(SOURCE_URI, after, hunks, "python")
    assert edit is not None and "load_rows" in edit.new
    assert importer_candidates(edit, IMPORTER_URI, IMPORTER) == []


def test_a_removed_parameter_drops_the_argument_at_the_importers_calls():
    after = SOURCE.replace("def fetch_rows(conn, table, limit):", "def fetch_rows(conn, table):")
    edit = edit_of(SOURCE_URI, SOURCE, after)
    found = importer_candidates(edit, IMPORTER_URI, IMPORTER)
    changed = IMPORTER
    for candidate in reversed(found):
        changed = applied(changed, candidate)
    assert [c.rule for c in found] == ["signature", "signature"]
    assert "fetch_rows(conn, table))" in changed  # by position
    assert "rows.fetch_rows(conn, table)" in changed  # by keyword, through the module
    assert "fetch_archived(conn, table, 5)" in changed  # another module's function


def test_a_decorated_function_and_a_package_imported_relatively():
    """The source is a package's __init__.py whose decorated function lost a parameter; the
    importer beside it imports the function with `from . import`."""
    source_uri = "file:///ws/ledger/__init__.py"
    source = "import functools\n\n\n@functools.cache\ndef fetch_rows(conn, table, limit):\n    return []\n"
    after = source.replace("(conn, table, limit)", "(conn, table)")
    edit = edit_of(source_uri, source, after)
    importer = "from . import fetch_rows\n\nrows = fetch_rows(conn, 'notes', 20)\n"
    found = importer_candidates(edit, "file:///ws/ledger/report.py", importer)
    assert [applied(importer, c) for c in found] == [
        "from . import fetch_rows\n\nrows = fetch_rows(conn, 'notes')\n"
    ]


def test_a_document_that_does_not_import_the_source_gets_nothing():
    after = SOURCE.replace("def fetch_rows(", "def load_rows(")
    edit = edit_of(SOURCE_URI, SOURCE, after)
    elsewhere = "file:///ws/billing/report.py"  # `.rows` there is billing/rows.py
    assert importer_candidates(edit, elsewhere, IMPORTER.replace("from . import rows\n", "")) == []
    assert importer_candidates(edit, SOURCE_URI, IMPORTER) == []


def test_the_pipeline_takes_the_import_then_the_import_rule_takes_the_uses():
    """As the server runs it: the source edited last, a request in the importer is answered
    from the source's edit (its import renamed); once that is applied, the importer's own latest
    edit is the import, whose rule renames the uses."""
    store = DocumentStore()
    store.open(SOURCE_URI, SOURCE, "python", 1)
    store.open(IMPORTER_URI, IMPORTER, "python", 1)
    at = SOURCE.index("fetch_rows(conn, table, limit)")
    line, column = store.get(SOURCE_URI).position_at(at)
    store.change(SOURCE_URI, [("load", (line, column, line, column + len("fetch")))], 2)
    documents = {
        uri: OpenDocument(uri, store.get(uri).text, "python") for uri in (SOURCE_URI, IMPORTER_URI)
    }
    importer = store.get(IMPORTER_URI)
    request = next_edit_request(store, importer, 0, 3)
    assert request.edited_elsewhere_since
    decision = decide_importer(request, documents)
    assert decision.shown is not None and decision.shown.rule == "rename"
    shown = decision.shown.edit
    line, column = importer.position_at(shown.start)
    store.change(IMPORTER_URI, [(shown.text, (line, column, line, column + len("fetch_rows")))], 2)
    importer = store.get(IMPORTER_URI)
    request = next_edit_request(store, importer, 0, 3)
    assert not request.edited_elsewhere_since
    own = decide(IMPORTER_URI, importer.text, request.hunks, "python")
    assert own.shown is not None and own.shown.rule == "import"
    assert importer.text[own.shown.edit.start : own.shown.edit.end] == "fetch_rows"
    assert importer.text.count("fetch_rows(conn, table, 100)") == 1


def test_the_bench_mines_importing_pairs_and_scores_the_answer(tmp_path):
    """`bench --edits --edits-importers` on a history the test writes: a commit that renames a
    function in ledger/rows.py and its import in ledger/report.py is a case, answered exactly;
    a commit that changes two files neither of which imports the other is none."""
    from test_bench_edits import commit, git

    from quickdraft.bench.edits_importers import mine_importer_cases, replay_importer_case

    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    commit(
        root,
        {"ledger/rows.py": SOURCE, "ledger/report.py": IMPORTER, "notes.py": "N = 1\n"},
        "2025-02-01T12:00:00+00:00",
    )
    commit(
        root,
        {
            "ledger/rows.py": SOURCE.replace("def fetch_rows(", "def load_rows("),
            "ledger/report.py": IMPORTER.replace(
                "RowCache, fetch_rows", "RowCache, load_rows"
            ).replace("in fetch_rows(", "in load_rows("),
        },
        "2025-03-01T12:00:00+00:00",
    )
    commit(root, {"notes.py": "N = 2\n", "ledger/rows.py": SOURCE}, "2025-04-01T12:00:00+00:00")
    cases = mine_importer_cases(root, since="2025-01-01", max_cases=10)
    assert [(c["source"], c["importer"]) for c in cases] == [("ledger/rows.py", "ledger/report.py")]
    run = replay_importer_case(cases[0])
    assert run["proposed"] and run["rule"] == "rename"
    assert run["helpful"] and run["exact"] and not run["harmful"]
