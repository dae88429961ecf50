"""Next-edit cases from a repository's git history: what both next-edit benches read of git.

A commit's change to one file is a case (`EditPair`, built by `edit_pair`): the file before the
commit with the first hunk applied (the user's edit, sent to the server as an incremental
didChange), the cursor at the end of that edit's new text, and the truth (the file as the
commit left it). Which commits and files qualify, and how many are picked, is edits_cases.py's.

Only `git log` and `git show` are used (subprocess, `--git-dir`), so a bare mirror with no work
tree serves as well as a checkout.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quickdraft.bench.holes import SKIP_DIRS
from quickdraft.context.syntax import EXTENSIONS, language_for_path
from quickdraft.errors import ConfigError

DEFAULT_SINCE = "2025-01-01"
MAX_FILE_BYTES = 200_000
GIT_TIMEOUT_S = 120.0

LOCK_FILES = frozenset(
    {
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "cargo.lock",
        "poetry.lock",
        "uv.lock",
        "pipfile.lock",
        "go.sum",
        "composer.lock",
        "gemfile.lock",
    }
)
GENERATED = re.compile(
    r"(\.min\.(js|css)$|_pb2(_grpc)?\.pyi?$|\.pb\.go$|\.pb\.(cc|h)$|_generated\.|\.generated\.|"
    r"(^|/)generated/|\.g\.dart$|\.bundle\.js$)",
    re.IGNORECASE,
)
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Hunk:
    """One `-U0` hunk: old lines [old_start, old_start + old_count) became the new ones (both
    0-based line indices where the lines begin)."""

    old_start: int
    old_count: int
    new_start: int
    new_count: int

    @classmethod
    def parse(cls, header: str) -> Hunk | None:
        match = _HUNK_HEADER.match(header)
        if match is None:
            return None
        a, b, c, d = match.groups()
        old_count = 1 if b is None else int(b)
        new_count = 1 if d is None else int(d)
        # An empty side names the line *before* it (git's rule); a non-empty one its first line.
        old_start = int(a) if old_count == 0 else int(a) - 1
        new_start = int(c) if new_count == 0 else int(c) - 1
        return cls(old_start, old_count, new_start, new_count)

    @property
    def old_end(self) -> int:
        return self.old_start + self.old_count


@dataclass(frozen=True)
class EditPair:
    """One next-edit case from one commit."""

    repository: str
    commit: str
    date: str
    """The commit date, ISO 8601."""
    path: str
    language: str
    before: str
    """The file as it was before the commit."""
    edit_start: int
    edit_end: int
    edit_text: str
    """The user's edit: `before[edit_start:edit_end]` replaced by `edit_text` (code points)."""
    truth: str
    """The file as the commit left it: what the next edits should make of `current` (one hunk:
    `current` itself, no edit is right)."""
    hunks: int
    """How many hunks the commit's change to the file has (the first is the user's edit)."""
    next_lines: int
    """Lines from the cursor's line down to the first line the second hunk changes (0: one
    hunk)."""

    @property
    def current(self) -> str:
        """The file after the user's edit: what the server sees when asked."""
        return self.before[: self.edit_start] + self.edit_text + self.before[self.edit_end :]

    @property
    def cursor(self) -> int:
        """Offset in `current` at the end of the edit's new text."""
        return self.edit_start + len(self.edit_text)

    @property
    def name(self) -> str:
        return f"{self.commit[:10]}:{self.path}"

    def to_dict(self, *, texts: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not texts:
            del data["before"], data["truth"]
        data["cursor"] = self.cursor
        return data


# --- git ------------------------------------------------------------------------------------


def git_dir(path: Path) -> Path:
    """The git directory of `path`: a checkout's `.git`, or `path` itself when it is one (a bare
    mirror). ConfigError when it is neither."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ConfigError(f"--edits-repo: {path} does not exist")
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--absolute-git-dir"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"--edits-repo: cannot run git on {path}: {exc}") from None
    if out.returncode != 0 or not out.stdout.strip():
        why = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "not a git repository"
        raise ConfigError(f"--edits-repo: {path} is not a git repository ({why})")
    return Path(out.stdout.strip())


def _git(directory: Path, *args: str) -> bytes:
    out = subprocess.run(
        ["git", f"--git-dir={directory}", "-c", "core.quotepath=off", *args],
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
    )
    if out.returncode != 0:
        raise ConfigError(
            f"git {args[0]} failed in {directory}: {out.stderr.decode(errors='replace').strip()}"
        )
    return out.stdout


def head_commit(directory: Path) -> str | None:
    try:
        return _git(directory, "rev-parse", "HEAD").decode().strip() or None
    except ConfigError:
        return None


@dataclass(frozen=True)
class Candidate:
    commit: str
    date: str
    path: str


def commit_files(directory: Path, since: str) -> Iterator[tuple[str, str, list[tuple[str, ...]]]]:
    """(commit, date, [(added, deleted, path), ...]) of each commit since `since`, newest
    first, merges left out (`git log --numstat`; a binary file's counts are "-").

    A partial clone (a mirror without its largest blobs) cannot count lines in a file whose
    blob it lacks: there the files come from `--name-only` (which reads no blob), and the
    counts only for source files (EXTENSIONS), which such mirrors keep; the others read "-"."""
    try:
        yield from _log_files(directory, since, "--numstat")
        return
    except ConfigError:
        pass  # git's own words may be translated: any other failure recurs below, as clear
    counted = {
        commit: {path: (added, deleted) for added, deleted, path in files}
        for commit, _, files in _log_files(
            directory, since, "--numstat", "--", *(f"*{suffix}" for suffix in EXTENSIONS)
        )
    }
    for commit, date, files in _log_files(directory, since, "--name-only"):
        counts = counted.get(commit, {})
        yield commit, date, [(*counts.get(path, ("-", "-")), path) for *_, path in files]


def _log_files(
    directory: Path, since: str, *how: str
) -> Iterator[tuple[str, str, list[tuple[str, ...]]]]:
    """`git log` of the commits since `since` with the files each changes (`how`: --numstat
    gives (added, deleted, path), --name-only (path,))."""
    raw = _git(
        directory,
        "log",
        "--no-merges",
        "--no-renames",
        f"--since={since}",
        "--format=%x01%H %cI",
        "-z",
        *how,
    )
    for block in raw.decode("utf-8", "replace").split("\x01")[1:]:
        header, *entries = block.split("\x00")
        commit, _, date = header.strip().partition(" ")
        files = []
        for entry in entries:
            if entry.strip():
                files.append(tuple(entry.strip("\n").split("\t", 2)))
        yield commit, date, files


def is_source(path: str) -> bool:
    """A source file quickdraft knows the language of, not vendored, generated or a lock file."""
    if not path or language_for_path(path) is None:
        return False
    parts = path.lower().split("/")
    if parts[-1] in LOCK_FILES or any(part in SKIP_DIRS for part in parts[:-1]):
        return False
    return GENERATED.search(path) is None


def _text(data: bytes) -> str | None:
    """The file's text, or None when it is binary, huge or not UTF-8."""
    if len(data) > MAX_FILE_BYTES or b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _hunks(directory: Path, candidate: Candidate) -> list[Hunk]:
    diff = _git(
        directory,
        "show",
        "--format=",
        "--no-renames",
        "--no-ext-diff",
        "--no-color",
        "-U0",
        candidate.commit,
        "--",
        candidate.path,
    )
    hunks = []
    for line in diff.decode("utf-8", "replace").splitlines():
        if line.startswith("Binary files"):
            return []
        if line.startswith("@@"):
            hunk = Hunk.parse(line)
            if hunk is not None:
                hunks.append(hunk)
    return hunks


def apply_hunks(old: list[str], new: list[str], hunks: list[Hunk]) -> str:
    """The old file's lines with `hunks` (in file order) taken from the new file."""
    out: list[str] = []
    position = 0
    for hunk in hunks:
        out += old[position : hunk.old_start]
        out += new[hunk.new_start : hunk.new_start + hunk.new_count]
        position = hunk.old_end
    out += old[position:]
    return "".join(out)


def smallest_change(before: str, after: str) -> tuple[int, int, str]:
    """(start, end, text): `before[start:end]` replaced by `text` gives `after`, with the common
    start and end left out (what a user typed, not the whole lines)."""
    limit = min(len(before), len(after))
    prefix = 0
    while prefix < limit and before[prefix] == after[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < limit - prefix
        and before[len(before) - 1 - suffix] == after[len(after) - 1 - suffix]
    ):
        suffix += 1
    return prefix, len(before) - suffix, after[prefix : len(after) - suffix]


def texts_at(directory: Path, commit: str, path: str) -> tuple[str, str] | None:
    """The file at `path` before `commit` and as it left it; None when the commit added or
    deleted it (or is a root commit), or either is binary or huge."""
    try:
        old_data = _git(directory, "show", f"{commit}^:{path}")
        new_data = _git(directory, "show", f"{commit}:{path}")
    except ConfigError:
        return None
    before, after = _text(old_data), _text(new_data)
    if before is None or after is None:
        return None
    return before, after


def edit_pair(
    directory: Path,
    repository: str,
    candidate: Candidate,
    hunks: list[Hunk],
) -> EditPair | None:
    """The case of `candidate`'s file changed by `hunks`: the first one typed, the truth the
    file as the commit left it; None when the file is binary, huge, added or deleted, or its
    lines disagree with the diff."""
    texts = texts_at(directory, candidate.commit, candidate.path)
    if texts is None:
        return None
    before, after = texts
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    if any(h.old_end > len(old) or h.new_start + h.new_count > len(new) for h in hunks):
        return None  # line counts the diff and the blobs disagree on (e.g. lone \r)
    current = apply_hunks(old, new, hunks[:1])
    truth = apply_hunks(old, new, hunks)
    if current == before:
        return None
    start, end, text = smallest_change(before, current)
    cursor_line = current.count("\n", 0, start + len(text))
    next_lines = 0
    if len(hunks) > 1:
        first, second = hunks[0], hunks[1]
        next_lines = second.old_start + first.new_count - first.old_count - cursor_line
    language = language_for_path(candidate.path)
    assert language is not None  # is_source() checked
    return EditPair(
        repository=repository,
        commit=candidate.commit,
        date=candidate.date,
        path=candidate.path,
        language=language.id,
        before=before,
        edit_start=start,
        edit_end=end,
        edit_text=text,
        truth=truth,
        hunks=len(hunks),
        next_lines=next_lines,
    )
