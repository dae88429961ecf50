"""`quickdraft complete` builds its prompt as the server does: with a workspace root, the one an
editor would have open (the server is told it at `initialize`), so paths read the same."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from quickdraft.cli import build_parser
from quickdraft.complete_cli import run, workspace_root


def test_the_root_is_the_nearest_folder_holding_git(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "pkg" / "sub").mkdir(parents=True)
    file = repo / "pkg" / "sub" / "a.py"
    file.write_text("x = 1\n")
    assert workspace_root(file) == repo.as_uri()
    # A worktree or submodule: `.git` is a file.
    inner = repo / "pkg" / "inner"
    inner.mkdir()
    (inner / ".git").write_text("gitdir: ../../.git/modules/inner\n")
    (inner / "b.py").write_text("y = 2\n")
    assert workspace_root(inner / "b.py") == inner.as_uri()
    # No repository: the current directory, as an editor opened there.
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "c.py").write_text("z = 3\n")
    monkeypatch.chdir(loose)
    if not any((p / ".git").exists() for p in loose.resolve().parents):
        assert workspace_root(Path("c.py")) == loose.resolve().as_uri()


class FakeCompleter:
    """Records the root it had when asked to complete."""

    def __init__(self):
        self.root = None
        self.roots_at_complete = []
        self.documents = {}
        self.models = SimpleNamespace(summary=lambda: "fake models")
        self.compute_path = None

    def set_document(self, uri, text, language_id=None):
        self.documents[uri] = text

    def complete(self, request, strategy=None):
        self.roots_at_complete.append(self.root)
        return SimpleNamespace(text="1", raw_text="1")


def test_complete_sets_the_root_before_completing(tmp_path, monkeypatch, capsys):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    file = repo / "src" / "a.py"
    file.write_text("x = \n")
    fake = FakeCompleter()
    monkeypatch.setattr("quickdraft.backends.load_completer", lambda config, progress=None: fake)
    args = build_parser().parse_args(["complete", str(file), "--line", "1", "--col", "5"])
    monkeypatch.chdir(tmp_path)
    assert run(args) == 0
    assert fake.roots_at_complete == [repo.as_uri()]
    assert list(fake.documents) == [file.resolve().as_uri()]
    assert capsys.readouterr().out == "1\n"
