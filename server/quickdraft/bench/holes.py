"""Completion points ("holes") sampled from a repository, as an editor user meets them.

A hole hides a span of a real file; the file without that span is the current document and the
hidden text is the ground truth. Three kinds, picked with tree-sitter so they fall where people
actually ask for completions:

- `line`: the rest of a line, from the start of a token that has code before it on the line;
- `block`: the body of a function or block after its header line, with the cursor where the
  editor puts it after Enter (start of the first body line, indentation already typed);
- `args`: a call's arguments, with the parentheses already there (`foo(|)`), as editors
  auto-close them.

Sampling is deterministic given the seed: files are listed in sorted order and every choice goes
through one `random.Random(seed)`.
"""

from __future__ import annotations

import importlib
import os
import random
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

KINDS: tuple[str, ...] = ("line", "block", "args")


@dataclass(frozen=True)
class LanguageSpec:
    language_id: str
    """The LSP language id, as the editor sends it."""
    extensions: tuple[str, ...]
    aliases: tuple[str, ...]
    grammar: tuple[str, str]
    """(module, function) returning the tree-sitter language pointer."""
    blocks: frozenset[str]
    """Node types whose body is a `block` hole."""
    calls: frozenset[str]
    """Parent node types whose argument list is an `args` hole."""
    arglists: frozenset[str] = frozenset({"argument_list", "arguments"})
    indent_block: bool = False
    """Python: a block is delimited by indentation, not braces."""


LANGUAGES: dict[str, LanguageSpec] = {
    spec.language_id: spec
    for spec in (
        LanguageSpec(
            "python",
            (".py",),
            ("py", "python"),
            ("tree_sitter_python", "language"),
            frozenset({"block"}),
            frozenset({"call"}),
            indent_block=True,
        ),
        LanguageSpec(
            "javascript",
            (".js", ".mjs", ".cjs"),
            ("js", "javascript"),
            ("tree_sitter_javascript", "language"),
            frozenset({"statement_block"}),
            frozenset({"call_expression", "new_expression"}),
        ),
        LanguageSpec(
            "javascriptreact",
            (".jsx",),
            ("js", "jsx", "javascriptreact"),
            ("tree_sitter_javascript", "language"),
            frozenset({"statement_block"}),
            frozenset({"call_expression", "new_expression"}),
        ),
        LanguageSpec(
            "typescript",
            (".ts", ".mts", ".cts"),
            ("ts", "typescript"),
            ("tree_sitter_typescript", "language_typescript"),
            frozenset({"statement_block"}),
            frozenset({"call_expression", "new_expression"}),
        ),
        LanguageSpec(
            "typescriptreact",
            (".tsx",),
            ("ts", "tsx", "typescriptreact"),
            ("tree_sitter_typescript", "language_tsx"),
            frozenset({"statement_block"}),
            frozenset({"call_expression", "new_expression"}),
        ),
        LanguageSpec(
            "rust",
            (".rs",),
            ("rs", "rust"),
            ("tree_sitter_rust", "language"),
            frozenset({"block"}),
            frozenset({"call_expression"}),
        ),
        LanguageSpec(
            "go",
            (".go",),
            ("go", "golang"),
            ("tree_sitter_go", "language"),
            frozenset({"block"}),
            frozenset({"call_expression"}),
        ),
        LanguageSpec(
            "java",
            (".java",),
            ("java",),
            ("tree_sitter_java", "language"),
            frozenset({"block", "constructor_body"}),
            frozenset({"method_invocation", "object_creation_expression"}),
        ),
        LanguageSpec(
            "c",
            (".c", ".h"),
            ("c",),
            ("tree_sitter_c", "language"),
            frozenset({"compound_statement"}),
            frozenset({"call_expression"}),
        ),
        LanguageSpec(
            "cpp",
            (".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx"),
            ("cpp", "c++", "cxx"),
            ("tree_sitter_cpp", "language"),
            frozenset({"compound_statement"}),
            frozenset({"call_expression"}),
        ),
    )
}

# Also opened as context (stubs, declarations), never sampled for holes.
CONTEXT_ONLY_SUFFIXES: dict[str, str] = {".pyi": "python", ".d.ts": "typescript"}

SKIP_DIRS = frozenset(
    {
        "node_modules",
        "vendor",
        "vendored",
        "_vendor",
        "third_party",
        "third-party",
        "thirdparty",
        "external",
        "dist",
        "build",
        "target",
        "__pycache__",
        "venv",
        "env",
        "site-packages",
        "bower_components",
        "coverage",
        "out",
    }
)
MAX_FILE_BYTES = 256_000
MAX_LINE_CHARS = 1000
GENERATED_MARKERS = ("@generated", "do not edit", "auto-generated", "autogenerated", "generated by")

# Leaves that are inside a literal or a comment: no `line` hole starts there.
_NO_CURSOR_LEAVES = (
    "comment",
    "string_content",
    "string_fragment",
    "escape_sequence",
    "string_end",
)

MAX_LINE_TRUTH = 160
MAX_ARGS_TRUTH = 200
MAX_BLOCK_TRUTH = 800
MAX_BLOCK_LINES = 12
MIN_BLOCK_TRUTH = 12
MIN_COPY_CHARS = 12


@dataclass
class Hole:
    file: str
    """Path relative to the repository, with forward slashes."""
    path: Path
    language: str
    line: int
    col: int
    """0-based, in code points, as the LSP layer hands it to `Completer`."""
    kind: str
    truth: str
    text: str
    """The document as the editor shows it: the file minus the hidden span."""
    offset: int
    """The cursor as an index into `text`."""
    open_files: list[OpenFile] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return self.path.as_uri()

    @property
    def copied_from(self) -> str | None:
        """The open file in which the hidden text stands verbatim (this file itself when it
        is elsewhere in the document), or None: a copy-heavy hole, made for prompt lookup.
        Text shorter than MIN_COPY_CHARS (once stripped) does not count."""
        return self.open_file_with(self.truth)

    def open_file_with(self, text: str) -> str | None:
        """The open file (or this one) holding `text` verbatim, once stripped; None if none
        does or it is shorter than MIN_COPY_CHARS."""
        body = text.strip()
        if len(body) < MIN_COPY_CHARS:
            return None
        for other in self.open_files:
            if body in other.text:
                return other.file
        return self.file if body in self.text else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "language": self.language,
            "line": self.line,
            "col": self.col,
            "kind": self.kind,
            "truth": self.truth,
            "open_files": [{"file": o.file, "why": o.why} for o in self.open_files],
            "copied_from": self.copied_from,
        }

    def typed(self, count: int) -> tuple[str, int, int]:
        """The document after typing the first `count` characters of the truth: (text, line, col)."""
        typed = self.truth[:count]
        text = self.text[: self.offset] + typed + self.text[self.offset :]
        line, col = offset_to_position(text, self.offset + len(typed))
        return text, line, col


@dataclass
class OpenFile:
    file: str
    path: Path
    language: str
    text: str
    why: str
    """imported | stub | test | same-directory"""

    @property
    def uri(self) -> str:
        return self.path.as_uri()


def offset_to_position(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    line = before.count("\n")
    return line, offset - (before.rfind("\n") + 1)


# --- languages ------------------------------------------------------------------------------


def resolve_languages(names: str | list[str] | None) -> list[str]:
    """`py,ts,rs` -> LSP language ids; None or empty means every supported language."""
    if not names:
        return list(LANGUAGES)
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    out: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        if not name:
            continue
        matches = [lid for lid, spec in LANGUAGES.items() if name == lid or name in spec.aliases]
        if not matches:
            from quickdraft.errors import ConfigError

            known = sorted({a for spec in LANGUAGES.values() for a in spec.aliases})
            raise ConfigError(f"--languages: unknown language {raw!r} (known: {', '.join(known)})")
        out.extend(m for m in matches if m not in out)
    return out


def language_of(path: str | Path) -> str | None:
    """The language id of a source file that can hold holes (None for anything else)."""
    name = str(path).lower()
    if any(name.endswith(suffix) for suffix in CONTEXT_ONLY_SUFFIXES):
        return None
    for spec in LANGUAGES.values():
        if name.endswith(spec.extensions):
            return spec.language_id
    return None


def context_language_of(path: str | Path) -> str | None:
    """Like `language_of`, but also knows stubs and declaration files."""
    name = str(path).lower()
    for suffix, language in CONTEXT_ONLY_SUFFIXES.items():
        if name.endswith(suffix):
            return language
    return language_of(name)


@cache
def _parser(language_id: str):
    import tree_sitter

    module_name, function = LANGUAGES[language_id].grammar
    module = importlib.import_module(module_name)
    return tree_sitter.Parser(tree_sitter.Language(getattr(module, function)()))


# --- files ----------------------------------------------------------------------------------


def read_source(path: Path) -> str | None:
    """The file's text, or None when it is binary, huge, minified or generated."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES or path.is_symlink():
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text.strip():
        return None
    lines = text.splitlines()
    if ".min." in path.name or any(len(line) > MAX_LINE_CHARS for line in lines):
        return None
    if len(text) / max(len(lines), 1) > 200:
        return None
    head = "\n".join(lines[:5]).lower()
    if any(marker in head for marker in GENERATED_MARKERS):
        return None
    return text


def discover_files(repo: str | Path) -> list[str]:
    """Every candidate source file (holes or context) under `repo`, relative, sorted."""
    repo = Path(repo)
    found: list[str] = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d.lower() not in SKIP_DIRS)
        for name in sorted(files):
            if context_language_of(name) is None:
                continue
            rel = (Path(root) / name).relative_to(repo).as_posix()
            found.append(rel)
    return sorted(found)


# --- candidates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    kind: str
    start: int
    end: int
    """Byte offsets into the encoded file."""


def _walk(node):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def _body_children(node) -> list:
    children = [c for c in node.children if c.is_named]
    if len(children) == 1 and children[0].type == "statement_list":
        children = [c for c in children[0].children if c.is_named]
    return children


def candidate_spans(source: bytes, language_id: str) -> dict[str, list[_Span]]:
    """Every hole the file offers, by kind, as byte spans (start = cursor, end = end of truth)."""
    spec = LANGUAGES[language_id]
    tree = _parser(language_id).parse(source)
    spans: dict[str, list[_Span]] = {kind: [] for kind in KINDS}
    line_starts = [0] + [m.end() for m in re.finditer(rb"\n", source)]

    def line_end(row: int) -> int:
        return line_starts[row + 1] - 1 if row + 1 < len(line_starts) else len(source)

    seen_line_cursor: set[int] = set()
    for node in _walk(tree.root_node):
        if node.has_error:
            continue
        kind_type = node.type
        if kind_type in spec.blocks:
            span = _block_span(node, spec, source)
            if span is not None:
                spans["block"].append(span)
        elif (
            kind_type in spec.arglists
            and node.parent is not None
            and node.parent.type in spec.calls
        ):
            kids = node.children
            if len(kids) >= 3 and kids[0].type == "(" and kids[-1].type == ")":
                start, end = kids[0].end_byte, kids[-1].start_byte
                body = source[start:end]
                fits = len(body) <= MAX_ARGS_TRUTH and body.count(b"\n") <= 3
                if body.strip() and fits and not body[:1].isspace():
                    spans["args"].append(_Span("args", start, end))
        elif node.child_count == 0 and node.end_byte > node.start_byte:
            if any(part in kind_type for part in _NO_CURSOR_LEAVES):
                continue
            if node.parent is not None and "comment" in node.parent.type:
                continue
            row = node.start_point[0]
            start = node.start_byte
            if start in seen_line_cursor:
                continue
            before = source[line_starts[row] : start]
            if not before.strip():
                continue  # the first token of a line: nothing typed yet, not a "rest of line"
            end = line_end(row)
            truth = source[start:end].rstrip()
            if len(truth.strip()) < 3 or len(truth) > MAX_LINE_TRUTH:
                continue
            seen_line_cursor.add(start)
            spans["line"].append(_Span("line", start, start + len(truth)))
    return spans


def _block_span(node, spec: LanguageSpec, source: bytes) -> _Span | None:
    children = _body_children(node)
    if not children:
        return None
    if spec.indent_block:
        header_row = node.parent.start_point[0] if node.parent is not None else -1
    else:
        braces = [c for c in node.children if c.type == "{"]
        if not braces:
            return None
        header_row = braces[0].start_point[0]
    first, last = children[0], children[-1]
    if first.start_point[0] <= header_row:
        return None  # one-liner: no line break to put the cursor after
    if not spec.indent_block:
        closing = [c for c in node.children if c.type == "}"]
        if not closing or closing[-1].start_point[0] <= last.end_point[0]:
            return None
    start, end = first.start_byte, last.end_byte
    body = source[start:end]
    if body.count(b"\n") + 1 > MAX_BLOCK_LINES or len(body) > MAX_BLOCK_TRUTH:
        return None
    if len(body.strip()) < MIN_BLOCK_TRUTH:
        return None  # `pass`, `return`: nothing to measure
    return _Span("block", start, end)


def make_hole(repo: Path, rel: str, language_id: str, text: str, span: _Span) -> Hole:
    data = text.encode("utf-8")
    prefix = data[: span.start].decode("utf-8")
    truth = data[span.start : span.end].decode("utf-8")
    rest = data[span.end :].decode("utf-8")
    document = prefix + rest
    line, col = offset_to_position(document, len(prefix))
    return Hole(
        file=rel,
        path=(repo / rel).resolve(),
        language=language_id,
        line=line,
        col=col,
        kind=span.kind,
        truth=truth,
        text=document,
        offset=len(prefix),
    )


# --- sampling -------------------------------------------------------------------------------


def sample_holes(
    repo: str | Path,
    count: int,
    *,
    languages: list[str] | None = None,
    seed: int = 0,
    kinds: tuple[str, ...] = KINDS,
    open_files: int = 4,
) -> list[Hole]:
    """`count` holes spread over languages (round robin), files (each used once before any is
    reused) and kinds (rotating), deterministic given `seed`. Each comes with the files an
    editor would have open next to it."""
    repo = Path(repo).resolve()
    wanted = resolve_languages(languages)
    rng = random.Random(seed)
    all_files = discover_files(repo)
    by_language: dict[str, list[str]] = {}
    for rel in all_files:
        lang = language_of(rel)
        if lang in wanted:
            by_language.setdefault(lang, []).append(rel)
    queues = {lang: [] for lang in sorted(by_language)}
    texts: dict[str, str | None] = {}
    spans_cache: dict[str, dict[str, list[_Span]]] = {}
    taken: set[tuple[str, int]] = set()
    holes: list[Hole] = []
    active = list(queues)
    attempts = 0
    kind_turn = rng.randrange(len(kinds))
    while len(holes) < count and active:
        attempts += 1
        if attempts > 50 * count + 10 * len(all_files):
            break
        lang = active[len(holes) % len(active)]
        queue = queues[lang]
        if not queue:
            pool = list(by_language[lang])
            rng.shuffle(pool)
            queue.extend(pool)
        rel = queue.pop(0)
        if rel not in texts:
            texts[rel] = read_source(repo / rel)
        text = texts[rel]
        spans = None
        if text is not None:
            if rel not in spans_cache:
                spans_cache[rel] = candidate_spans(text.encode("utf-8"), lang)
            spans = spans_cache[rel]
        order = [kinds[(kind_turn + i) % len(kinds)] for i in range(len(kinds))]
        chosen = None
        for kind in order if spans else ():
            options = [s for s in spans[kind] if (rel, s.start) not in taken]
            if options:
                chosen = rng.choice(options)
                break
        if chosen is None:
            # Drop the file for good; drop the language once none of its files has a hole left.
            by_language[lang] = [f for f in by_language[lang] if f != rel]
            queue[:] = [f for f in queue if f != rel]
            if not by_language[lang]:
                active.remove(lang)
            continue
        taken.add((rel, chosen.start))
        kind_turn = (kind_turn + 1) % len(kinds)
        hole = make_hole(repo, rel, lang, text, chosen)
        hole.open_files = choose_open_files(repo, hole, all_files, rng, limit=open_files)
        holes.append(hole)
    return holes


# --- the other open files -------------------------------------------------------------------


def _import_targets(hole: Hole, all_files: list[str]) -> list[str]:
    """Files of the repo that the hole's document imports (best effort, by path)."""
    text, here = hole.text, Path(hole.file).parent
    files = set(all_files)
    found: list[str] = []

    def add(candidate: Path | str) -> bool:
        rel = Path(os.path.normpath(candidate)).as_posix()
        if rel in files and rel != hole.file and rel not in found:
            found.append(rel)
            return True
        return False

    def by_suffix(suffix: str) -> None:
        for rel in all_files:
            if (rel == suffix or rel.endswith("/" + suffix)) and add(rel):
                return

    lang = hole.language
    if lang == "python":
        for dots, module, names in re.findall(
            r"^\s*from\s+(\.*)([\w.]*)\s+import\s+\(?([\w\s,]*)", text, re.M
        ):
            parts = [p for p in module.split(".") if p]
            if dots:
                base = here
                for _ in range(len(dots) - 1):
                    base = base.parent
                targets = [base.joinpath(*parts)] if parts else []
                if not parts:
                    targets += [base / n.strip() for n in names.split(",") if n.strip()]
                for target in targets:
                    add(f"{target}.py") or add(target / "__init__.py")
                    add(f"{target}.pyi")
            elif parts:
                joined = "/".join(parts)
                by_suffix(f"{joined}.py")
                by_suffix(f"{joined}/__init__.py")
        for module in re.findall(r"^\s*import\s+([\w.]+)", text, re.M):
            by_suffix(module.replace(".", "/") + ".py")
    elif lang in ("javascript", "javascriptreact", "typescript", "typescriptreact"):
        pattern = r"""(?:from\s+|require\(\s*|import\s*\(?\s*)['"](\.{1,2}/[^'"]+)['"]"""
        exts = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", ".d.ts", "/index.ts", "/index.js")
        for spec in re.findall(pattern, text):
            for ext in exts:
                if add(here / f"{spec}{ext}"):
                    break
    elif lang == "rust":
        for name in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            add(here / f"{name}.rs") or add(here / name / "mod.rs")
        for name in re.findall(r"\buse\s+(?:crate|super|self)::(\w+)", text):
            by_suffix(f"{name}.rs")
    elif lang == "java":
        for name in re.findall(r"^\s*import\s+(?:static\s+)?([\w.]+)\s*;", text, re.M):
            by_suffix(name.replace(".", "/") + ".java")
    elif lang in ("c", "cpp"):
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            add(here / name) or by_suffix(name)
    return found


def _companions(hole: Hole, all_files: list[str]) -> tuple[list[str], list[str]]:
    """(stubs or headers, tests) that belong to the hole's file by name."""
    path = Path(hole.file)
    stem, here = path.name.split(".")[0], path.parent.as_posix()
    here = "" if here == "." else here + "/"
    stubs = {
        f"{here}{stem}.pyi",
        f"{here}{stem}.d.ts",
        f"{here}{stem}.h",
        f"{here}{stem}.hpp",
        f"{here}{stem}.c",
        f"{here}{stem}.cc",
        f"{here}{stem}.cpp",
    }
    test_names = {
        f"test_{stem}.py",
        f"{stem}_test.py",
        f"{stem}_test.go",
        f"{stem}.test.ts",
        f"{stem}.spec.ts",
        f"{stem}.test.js",
        f"{stem}.spec.js",
        f"{stem}.test.tsx",
        f"{stem}Test.java",
    }
    found_stubs = [f for f in all_files if f in stubs and f != hole.file]
    tests = [f for f in all_files if f.rsplit("/", 1)[-1] in test_names and f != hole.file]
    return found_stubs, tests


def choose_open_files(
    repo: Path, hole: Hole, all_files: list[str], rng: random.Random, *, limit: int = 4
) -> list[OpenFile]:
    """What an editor would have open next to the hole: imported modules first, then the stub or
    header, tests, and other files of the same directory."""
    if limit <= 0:
        return []
    picks: list[tuple[str, str]] = []
    for rel in _import_targets(hole, all_files):
        picks.append((rel, "imported"))
    stubs, tests = _companions(hole, all_files)
    picks += [(rel, "stub") for rel in stubs]
    picks += [(rel, "test") for rel in tests]
    here = Path(hole.file).parent
    siblings = [
        rel
        for rel in all_files
        if Path(rel).parent == here
        and rel != hole.file
        and context_language_of(rel) == context_language_of(hole.file)
    ]
    rng.shuffle(siblings)
    picks += [(rel, "same-directory") for rel in siblings]
    chosen: list[OpenFile] = []
    seen: set[str] = {hole.file}
    for rel, why in picks:
        if rel in seen:
            continue
        seen.add(rel)
        text = read_source(repo / rel)
        language = context_language_of(rel)
        if text is None or language is None:
            continue
        chosen.append(OpenFile(rel, (repo / rel).resolve(), language, text, why))
        if len(chosen) >= limit:
            break
    return chosen
