"""Next edits in a real, headless Neovim (extension/nvim's lua/quickdraft/nextedit.lua), and
sidekick.nvim's next-edit suggestions served by quickdraft.

- `test_next_edit_shown_jumped_to_and_applied`: the real `quickdraft serve` whose model finishes
  the rename the last edit started (test_inline_edit_lsp.py's RenamingBackend, so the edit is
  known exactly): renaming a parameter in Normal mode shows the rest of the rename where it
  applies, <Tab> jumps to it, <Tab> applies it, and the file on disk after :w is the text plus
  the edit; an edit for an older version of the buffer is never applied nor shown.
- `test_next_edit_after_accepting_a_suggestion`: the scripted server (extension/nvim/tests/
  fake_server.py): accepting ghost text asks for the next edit at once, for the version the
  client sent; an answer for another version is never shown; :QuickdraftStatus's line.
- `test_sidekick_shows_and_applies_quickdraft_edits`: sidekick.nvim (never vendored: its files
  are looked for in $QUICKDRAFT_SIDEKICK, else ~/.cache/quickdraft-e2e/sidekick.nvim; the test
  skips without them) with quickdraft started under a client name that holds "copilot" (how
  sidekick finds its next-edit server): sidekick shows quickdraft's edit and applies it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from test_nvim import NVIM, PLUGIN, WHY_NOT, passed, run_scenario

pytestmark = pytest.mark.skipif(NVIM is None, reason=WHY_NOT)

HERE = Path(__file__).resolve().parent
RENAMING_SERVER = [
    sys.executable,
    str(HERE / "test_inline_edit_lsp.py"),
    "serve",
    "--target",
    "fake",
]
SHAPES = (
    "def area(width, height):\n"
    "    scale = width * height\n"
    "    return width * height\n"
    "\n"
    "\n"
    "print(area(2, 3))\n"
)


def on_shapes(tmp_path: Path, scenario: str, server: list[str], **env: str) -> dict:
    """Run `scenario` on a fresh shapes.py (SHAPES) with `server` as the plugin's command."""
    source = tmp_path / "shapes.py"
    source.write_text(SHAPES)
    env = {"QD_CMD": json.dumps(server), "QD_FILE": str(source), **env}
    return run_scenario(scenario, tmp_path, env, timeout=180)


def sidekick_dir() -> Path:
    """Where sidekick.nvim's files are looked for: $QUICKDRAFT_SIDEKICK, else
    ~/.cache/quickdraft-e2e/sidekick.nvim (e.g. `git clone https://github.com/folke/sidekick.nvim
    ~/.cache/quickdraft-e2e/sidekick.nvim`)."""
    configured = os.environ.get("QUICKDRAFT_SIDEKICK")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "quickdraft-e2e" / "sidekick.nvim"


@pytest.mark.slow
def test_next_edit_shown_jumped_to_and_applied(tmp_path: Path):
    result = on_shapes(tmp_path, "e2e_nextedit.lua", RENAMING_SERVER)
    assert {
        "leaving Insert mode asks for the next edit, and it is shown",
        "the text the edit removes is highlighted with QuickdraftEditDelete",
        "the text it puts in is shown after it as virtual text (QuickdraftEditAdd)",
        "the server is told the edit was shown (didShowInlineEdit)",
        ":QuickdraftStatus shows the last next edit: latency, tokens per forward",
        "<Tab> moves the cursor to the start of the edit",
        "the second <Tab> applies it: the text is the edit shown",
        "the file on disk after :w is the text plus the edit",
        "an edit for an older version is not applied",
        "show() refuses an edit for another version",
        "on disk: no edit applied",
    } <= passed(result)
    data = result["data"]
    # The server's answer, exactly (test_inline_edit_lsp.py checks the same rename over LSP).
    assert data["edits"] == [
        {
            "text": " * height\n    return w",
            "range": {
                "start": {"line": 1, "character": len("    scale = w")},
                "end": {"line": 2, "character": len("    return width")},
            },
        }
    ], data
    assert data["on_disk"] == SHAPES.replace("width", "w")


@pytest.mark.slow
def test_the_rename_rule_is_drawn_use_after_use_and_tab_applies_each(tmp_path: Path):
    """The default settings (rules first; the scripted backend never writes a rewrite): the
    rename of a parameter is drawn at its next use, <Tab><Tab> applies it, the next answer is
    the use after it, then no edit; the file on disk is the whole rename."""
    result = on_shapes(tmp_path, "e2e_nextedit_rules.lua", [*RENAMING_SERVER, "--rules"])
    assert {
        "first use: an edit is drawn",
        "first use: <Tab> moves the cursor to it",
        "first use: the second <Tab> applies it",
        "second use: an edit is drawn",
        "second use: <Tab> moves the cursor to it",
        "second use: the second <Tab> applies it",
        "then the answer is no edit",
        "and nothing is drawn",
    } <= passed(result)
    data = result["data"]
    # Each answer is the rule's one edit, `width` -> `w` at the next use.
    assert [(d["range"]["start"], d["text"]) for d in (data["first use"], data["second use"])] == [
        ({"line": 1, "character": len("    scale = ")}, "w"),
        ({"line": 2, "character": len("    return ")}, "w"),
    ], data
    assert data["on_disk"] == SHAPES.replace("width", "w")


@pytest.mark.slow
def test_a_rename_is_drawn_in_the_file_that_imports_it_when_it_is_opened(tmp_path: Path):
    """The default settings: `area` renamed in shapes.py (its use there applied by <Tab><Tab>),
    then report.py, which imports it, opened: its import's rename is drawn with no keystroke,
    applied, then its call's; both files on disk are the whole rename."""
    report = tmp_path / "report.py"
    report.write_text("from shapes import area\n\n\nprint(area(4, 5))\n")
    result = on_shapes(
        tmp_path,
        "e2e_nextedit_importer.lua",
        [*RENAMING_SERVER, "--rules"],
        QD_REPORT=str(report),
    )
    assert {
        "the server starts and attaches to shapes.py",
        "shapes.py, its use: the second <Tab> applies it",
        "report.py, its import: an edit is drawn",
        "report.py, its import: <Tab> moves the cursor to it",
        "report.py, its import: the second <Tab> applies it",
        "report.py, its call: the second <Tab> applies it",
    } <= passed(result)
    data = result["data"]
    assert data["report.py, its import"]["uri"].endswith("/report.py")
    assert data["report_on_disk"] == "from shapes import surface\n\n\nprint(surface(4, 5))\n"
    assert data["shapes_on_disk"] == SHAPES.replace("area", "surface")


@pytest.mark.slow
def test_next_edit_after_accepting_a_suggestion(tmp_path: Path):
    source = tmp_path / "main.py"
    source.write_text("def add(a, b):\n    return a + b\n")
    log = tmp_path / "fake.log"
    env = {
        "QD_CMD": json.dumps([sys.executable, str(PLUGIN / "tests" / "fake_server.py")]),
        "QD_FILE": str(source),
        "QD_FAKE_LOG": str(log),
        "QD_FAKE_SUGGESTION": "total = add(1, 2)",
        "QD_FAKE_INLINE_EDIT": "1",
    }
    result = run_scenario("e2e_nextedit_fake.lua", tmp_path, env, timeout=120)
    assert {
        "accepting the suggestion asks for the next edit at once",
        "the request carries the version the client sent",
        "the edit is shown in Insert mode after accepting",
        "typing clears it",
        "an answer for another version is never shown",
        ":QuickdraftStatus shows the next edit's latency and tokens per forward",
        "handlers get ctx.request_id",
    } <= passed(result)
    requests = [
        json.loads(line)["data"]
        for line in log.read_text().splitlines()
        if json.loads(line)["event"] == "copilotInlineEdit"
    ]
    assert requests and all(isinstance(r["version"], int) for r in requests), requests


@pytest.mark.slow
def test_sidekick_shows_and_applies_quickdraft_edits(tmp_path: Path):
    sidekick = sidekick_dir()
    if not (sidekick / "lua" / "sidekick" / "nes" / "init.lua").exists():
        pytest.skip(
            f"sidekick.nvim not found in {sidekick} (set $QUICKDRAFT_SIDEKICK or clone "
            "https://github.com/folke/sidekick.nvim there)"
        )
    result = on_shapes(tmp_path, "e2e_sidekick.lua", RENAMING_SERVER, QD_SIDEKICK=str(sidekick))
    assert {
        "sidekick finds quickdraft as its next-edit server",
        "sidekick shows quickdraft's edit",
        "sidekick applies it",
        "the file on disk after :w is the text plus the edit",
    } <= passed(result)
    assert (tmp_path / "shapes.py").read_text() == SHAPES.replace("width", "w")
