"""`quickdraft bench --edits --edits-signatures`: an added parameter's argument at each call.

The `--edits-rules` cases hold almost none of these: a commit that gives a function a parameter
usually changes more lines than a case's few close hunks. So they are mined on their own: every
commit since `--edits-since` (at most MAX_FILES Python files) in which one `def` of a file gained
one parameter without a default and each of the same file's calls of it (by name, as many
before as after) gained one positional argument. The `def`'s header lines are typed as the
edit (whole lines, as the document store keeps an editor's change), the next edit is asked
through the pipeline with the model (`next_edit.suggest`, the settings' filler and vetoes), and
its first proposal is compared with the commit's argument at that call:

- `same`: at a call the commit changed, the argument the commit passed (commas aside);
- `other argument`: at such a call, another argument (a near miss counts here);
- `other call`: at a call the commit left as it was;
- `nothing`: no proposal.

`written` counts the proposals whose argument the model wrote (no same-named variable in scope).
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quickdraft.bench.edits import commit_files, git_dir, texts_at
from quickdraft.bench.edits_rules_cli import history_name, model_sources, write_results
from quickdraft.bench.provenance import provenance
from quickdraft.context.edit_history import Hunk
from quickdraft.errors import ConfigError

if TYPE_CHECKING:
    from quickdraft.next_edit import EditSources

PREFIX = "quickdraft bench --edits --edits-signatures"
MAX_FILES = 6
"""Python files a commit may change to be read (a larger one is a refactoring of its own)."""
VERDICTS = ("same", "other argument", "other call", "nothing")


@dataclass(frozen=True)
class SignatureCase:
    repository: str
    commit: str
    path: str
    name: str
    """The function that gained a parameter."""
    added: str
    before: str
    """The file before the commit."""
    start: int
    """Where the `def`'s header lines start in `before` (code points)."""
    old_header: str
    new_header: str
    """The header lines before and after the commit: the edit typed."""
    arguments: dict[int, str] = field(default_factory=dict)
    """Line (1-based, in `before`) of each call the commit changed -> the argument it passed."""

    @property
    def label(self) -> str:
        return f"{self.commit[:10]}:{self.path}:{self.name}"


def _functions(tree: ast.AST) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.setdefault(node.name, []).append(node)
    return found


def _positional(function: Any) -> tuple[list[str], list[str]]:
    """(names of its positional parameters, those of them without a default)."""
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args]
    required = names[: len(names) - len(args.defaults)] if args.defaults else names
    return names, required


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    def called(node: ast.Call) -> str | None:
        function = node.func
        if isinstance(function, ast.Name):
            return function.id
        return function.attr if isinstance(function, ast.Attribute) else None

    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and called(n) == name]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _header(text: str, function: Any) -> tuple[int, str]:
    """(offset, text) of a function's header lines: its `def` line to the line before its
    body's first statement."""
    lines = text.splitlines(keepends=True)
    first, body = function.lineno - 1, function.body[0].lineno - 1
    return sum(len(line) for line in lines[:first]), "".join(lines[first:body])


def cases_in(repository: str, commit: str, path: str, before: str, after: str):
    """The file's functions that gained one parameter without a default, whose calls in the
    file each gained an argument at its place (`SignatureCase`)."""
    try:
        old_tree, new_tree = ast.parse(before), ast.parse(after)
    except (SyntaxError, ValueError):
        return
    old_functions = _functions(old_tree)
    for name, defs in _functions(new_tree).items():
        olds = old_functions.get(name, [])
        if len(defs) != 1 or len(olds) != 1:
            continue
        (old_names, _), (new_names, required) = _positional(olds[0]), _positional(defs[0])
        added = [p for p in new_names if p not in old_names]
        if (
            len(added) != 1
            or any(p not in new_names for p in old_names)
            or added[0] not in required
        ):
            continue
        old_calls, new_calls = _calls(old_tree, name), _calls(new_tree, name)
        if not old_calls or len(old_calls) != len(new_calls):
            continue
        index = new_names.index(added[0]) - (1 if new_names[0] in ("self", "cls") else 0)
        arguments = {}
        for old_call, new_call in zip(old_calls, new_calls, strict=True):
            gained = len(new_call.args) == len(old_call.args) + 1 and not old_call.keywords
            if gained and 0 <= index < len(new_call.args):
                text = ast.get_source_segment(after, new_call.args[index])
                if text:
                    arguments[old_call.lineno] = text
        if not arguments:
            continue
        start, old_header = _header(before, olds[0])
        _, new_header = _header(after, defs[0])
        if not old_header or not new_header:
            continue  # a body on the header's line (`def f(a): ...`): no line to type alone
        yield SignatureCase(
            repository,
            commit,
            path,
            name,
            added[0],
            before,
            start,
            old_header,
            new_header,
            arguments,
        )


def mine_signature_cases(repo: Path, since: str) -> list[SignatureCase]:
    """Every case of the history since `since`, oldest commit last (as `git log` lists them)."""
    directory = git_dir(repo)
    repository = str(Path(repo).expanduser().resolve())
    found = []
    for commit, _, files in commit_files(directory, since):
        paths = [path for *_, path in files if path.endswith(".py")]
        if not paths or len(paths) > MAX_FILES:
            continue
        for path in paths:
            texts = texts_at(directory, commit, path)
            if texts is not None:
                found.extend(cases_in(repository, commit, path, *texts))
    return found


def replay(case: SignatureCase, sources: EditSources) -> dict[str, Any]:
    """The next edit after the header is typed, and what it is against the commit."""
    from quickdraft.generation import NextEditRequest
    from quickdraft.next_edit import suggest

    uri = "file:///bench/" + case.path
    end = case.start + len(case.old_header)
    document = case.before[: case.start] + case.new_header + case.before[end:]
    line = case.before.count("\n", 0, case.start)
    hunk = Hunk(uri, case.start, line, case.old_header, case.new_header)
    began = time.perf_counter()
    answer = suggest(sources, NextEditRequest(uri, document, line, 0, "python", hunks=[hunk]))
    run: dict[str, Any] = {
        "case": case.label,
        "repository": history_name(Path(case.repository)),
        "added": case.added,
        "latency_ms": round((time.perf_counter() - began) * 1000, 1),
        "written": answer.filled > 0 and bool(answer.edits),
        "vetoed": dict(answer.vetoed),
        "text": None,
        "verdict": "nothing",
    }
    if answer.edits:
        edit = answer.edits[0]
        at = document.count("\n", 0, edit.start) + 1
        if edit.start >= case.start + len(case.new_header):  # below the header: as in `before`
            at -= case.new_header.count("\n") - case.old_header.count("\n")
        wanted = case.arguments.get(at)
        written = edit.text.strip().strip(",").strip()
        run["text"] = edit.text
        if wanted is None:
            run["verdict"] = "other call"
        else:
            run["verdict"] = "same" if written == wanted else "other argument"
    return run


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts = Counter(run["verdict"] for run in runs)
    written = Counter(run["verdict"] for run in runs if run["written"])
    answered = sorted(run["latency_ms"] for run in runs if run["text"] is not None)
    return {
        "functions": len(runs),
        **{verdict: verdicts.get(verdict, 0) for verdict in VERDICTS},
        "written": sum(written.values()),
        "written_same": written.get("same", 0),
        "answer_p50_ms": answered[len(answered) // 2] if answered else None,
    }


def render(per_history: dict[str, dict[str, Any]], overall: dict[str, Any]) -> str:
    rows = [
        "| history | functions | same argument | another argument | another call | nothing "
        "| the model wrote (the same) | answer p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, item in [*per_history.items(), ("overall", overall)]:
        rows.append(
            f"| {name} | {item['functions']} | {item['same']} | {item['other argument']} | "
            f"{item['other call']} | {item['nothing']} | {item['written']} "
            f"({item['written_same']}) | {item['answer_p50_ms']} |"
        )
    return "\n".join(rows)


def run_signatures_bench(args: argparse.Namespace, repos: str) -> int:
    histories = [Path(part) for part in repos.split(",") if part]
    cases: list[SignatureCase] = []
    for history in histories:
        mined = mine_signature_cases(history, args.edits_since)
        print(f"{PREFIX}: {len(mined)} functions from {history}", file=sys.stderr)
        cases.extend(mined)
    if not cases:
        raise ConfigError(
            f"--edits-repo: no commit since {args.edits_since} gave a function a parameter "
            "without a default and each of its calls in the file an argument"
        )
    if args.edits_list:
        for case in cases:
            print(f"{case.label} +{case.added}: {sorted(case.arguments.items())}")
        return 0
    sources = model_sources(args, veto=False)
    runs = []
    for case in cases:
        run = replay(case, sources)
        runs.append(run)
        print(f"  {run['verdict']:14} {case.label} +{case.added}: {run['text']!r}")
    per_history = {
        name: summarize([r for r in runs if r["repository"] == name])
        for name in dict.fromkeys(r["repository"] for r in runs)
    }
    overall = summarize(runs)
    results = {
        "env": {
            **provenance(),
            "histories": [str(h) for h in histories],
            "since": args.edits_since,
        },
        "cases": [{k: v for k, v in asdict(c).items() if k != "before"} for c in cases],
        "runs": runs,
        "summary": overall,
        "per_history": per_history,
    }
    table = render(per_history, overall)
    write_results(args, "edits-signatures", results, "An added parameter's argument", table)
    return 0
