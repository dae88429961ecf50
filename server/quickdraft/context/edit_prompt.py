"""The prompt of a next edit: the editable region around the cursor, and one format per model.

The model is shown the person's recent edits (unified diffs, context.edit_history), the tops of
the other open files (the workspace head completions use), and the code around the cursor, and
writes the *editable region* as it should be after the next edit. Every format ends its prompt
with the opening of the answer, so the model's first token is the region's first token and the
region as it stands drafts the whole answer (copy drafting, aligned from token 0).

Region (`choose_region`): `lines_above` lines above the cursor's line and `lines_below` below
it, never past the file; when the cursor is at the lines the person just edited (`edited`, the
latest hunk's lines), above and below *those lines*, so the region holds the whole edit and
starts where it started before the edit (the lines above and below it are the same text with
the edit made or not, which keeps the prompt's head the one a request before the edit cached:
see the `instruct` layout); with a grammar (context.syntax) each end moves to the nearest
statement boundary within SNAP_LINES lines (out first, then in, never past the cursor's line
or the edited lines),
so the region does not cut a statement in half when a boundary is that close. The region is
whole lines; its text leaves out the last line's break (the answer ends where the region
does, before the closing marker).

Formats (`FORMATS`), each from its model's card or the prompt code its authors publish (the
wording of the instructions here is quickdraft's own; the layout, section names and markers
are theirs):

* `instruct`: a ChatML conversation for instruction-tuned chat models (the Qwen2.5-Coder
  Instruct models quickdraft ships): `<|im_start|>system … <|im_end|>` with the whole
  instruction, the user turn with the other files, the lines above and below the region, the
  region itself, the recent edits as one ```diff block and a short ask naming the cursor's
  line, then `<|im_start|>assistant\\n```lang\\n`: the answer is the region, closed by "\\n```"
  (or the end of the turn). What an edit changes comes last: the prompt a request made before
  the edit (the cursor resting there) left in the cache is the same text down to the edited
  line, so the request after it computes only the rest of the region, the diff and the ask.
* `zeta` (zed-industries/zeta): `### Instruction:`, `### User Edits:` (each hunk as `User
  edited "path":` and a ```diff block), `### User Excerpt:` (the excerpt in a ```path fence,
  `<|start_of_file|>` at the top of a file, the region between `<|editable_region_start|>` and
  `<|editable_region_end|>`, `<|user_cursor_is_here|>` at the cursor), `### Response:`; the
  answer repeats the excerpt up to the region start, which the prompt already holds.
* `sweep` (sweepai's next-edit models, Qwen2.5-Coder based): files as `<|file_sep|>path`
  blocks, each recent hunk as `<|file_sep|>path.diff` with `original:` and `updated:`, then
  the region as it was before the latest hunk (`original/path`), as it is (`current/path`),
  and `<|file_sep|>updated/path`, after which the model writes the region until
  `<|file_sep|>` (a stop token).
* `instinct` (Continue's Instinct, Qwen2.5-Coder based): ChatML; the user turn has
  `### Context:` (`<|context_file|> path` / `<|snippet|>` items), `### User Edits:` (newest
  first), `### User Excerpt:` with the region markers and the cursor marker, `### Response:`;
  the assistant turn is the region alone, ended by `<|im_end|>`.

Document text is defused before it goes in (a marker of the format or a special token of the
family written in a file cannot end a section early).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import quickdraft.context.syntax as syntax
from quickdraft.context.edit_history import Hunk, lines_with_breaks, unified_diff
from quickdraft.context.fim import PromptPart
from quickdraft.context.snippets import uri_to_path
from quickdraft.text import split_lines

SNAP_LINES = 3
"""A region end moves to a statement boundary at most this many lines away."""
SNAP_LOOKBACK = 200
"""The parse for boundaries starts at an unindented line at most this far above the region."""
SNAP_DEPTH = 4
"""Statements nested this deep (a method's statements in a class) count as boundaries."""
CONTEXT_LINES = 12
"""Lines of the file shown above and below the region (read, not rewritten)."""

CURSOR = "<|user_cursor_is_here|>"
REGION_START = "<|editable_region_start|>"
REGION_END = "<|editable_region_end|>"
START_OF_FILE = "<|start_of_file|>"
FILE_SEP = "<|file_sep|>"
CONTEXT_FILE = "<|context_file|>"
SNIPPET = "<|snippet|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_MARKERS = (CURSOR, REGION_START, REGION_END, START_OF_FILE, FILE_SEP, CONTEXT_FILE, SNIPPET)
_ZWSP = "\u200b"


# --- the region ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EditableRegion:
    """The lines the model rewrites, and the lines it reads around them."""

    start: int
    """Offset (code points) of the region's first character (a line start)."""
    end: int
    """Offset just after the region's text (the last line's end, before its break)."""
    start_line: int
    end_line: int
    """0-based line after the region's last line."""
    text: str
    cursor: int
    """The cursor's offset into `text`."""
    before: str = ""
    """Up to CONTEXT_LINES whole lines above the region (their breaks included)."""
    after: str = ""
    """Up to CONTEXT_LINES lines below the region (from the line after it, no final break)."""
    at_file_start: bool = False
    at_file_end: bool = False

    @property
    def lines(self) -> int:
        return self.end_line - self.start_line


def _boundaries(
    contents: Sequence[str], endings: Sequence[str], first: int, last: int, grammar: str
) -> set[int]:
    """Lines in [first, last) where a statement starts (nesting depth <= SNAP_DEPTH)."""
    top = first
    for row in range(first, max(first - SNAP_LOOKBACK, 0) - 1, -1):
        line = contents[row]
        if line and not line[0].isspace() and line[0] not in ")]}":
            top = row
            break
    else:
        top = max(first - SNAP_LOOKBACK, 0)
    window = "".join(c + e for c, e in zip(contents[top:last], endings[top:last], strict=True))
    return {top + row for row in syntax.statement_start_lines(window, grammar, SNAP_DEPTH)}


def choose_region(
    text: str,
    offset: int,
    *,
    lines_above: int,
    lines_below: int,
    language_id: str | None = None,
    path: str | None = None,
    edited: tuple[int, int] | None = None,
) -> EditableRegion:
    """The editable region around the cursor at `offset` (code points into `text`).
    `edited`: the first and last 0-based line of the latest edit; when the cursor's line is
    within a line of them, the region is counted from those lines instead."""
    contents, endings = split_lines(text)
    starts = [0]
    for content, ending in zip(contents[:-1], endings[:-1], strict=True):
        starts.append(starts[-1] + len(content) + len(ending))
    offset = max(0, min(offset, len(text)))
    line = bisect.bisect_right(starts, offset) - 1
    count = len(contents)
    top = bottom = line
    if edited is not None and edited[0] - 1 <= line <= edited[1] + 1:
        top, bottom = min(line, edited[0]), max(line, min(edited[1], count - 1))
    start = max(0, top - lines_above)
    end = min(count, bottom + lines_below + 1)
    grammar = syntax.resolve_language(language_id, path)
    if grammar is not None and count > 1:
        found = _boundaries(
            contents, endings, max(start - SNAP_LINES, 0), min(end + SNAP_LINES + 1, count), grammar
        )
        found |= {0, count}
        if start not in found:
            out = [r for r in found if start - SNAP_LINES <= r < start]
            within = [r for r in found if start < r <= min(top, start + SNAP_LINES)]
            start = max(out) if out else min(within) if within else start
        if end not in found:
            out = [r for r in found if end < r <= end + SNAP_LINES]
            within = [r for r in found if max(bottom + 1, end - SNAP_LINES) <= r < end]
            end = min(out) if out else max(within) if within else end
    region_start = starts[start]
    region_end = starts[end - 1] + len(contents[end - 1])
    before_start = starts[max(0, start - CONTEXT_LINES)]
    after_end = starts[min(count, end + CONTEXT_LINES) - 1] + len(
        contents[min(count, end + CONTEXT_LINES) - 1]
    )
    after = text[region_end + len(endings[end - 1]) : after_end] if end < count else ""
    return EditableRegion(
        start=region_start,
        end=region_end,
        start_line=start,
        end_line=end,
        text=text[region_start:region_end],
        cursor=offset - region_start if offset <= region_end else region_end - region_start,
        before=text[before_start:region_start],
        after=after,
        at_file_start=start == 0,
        at_file_end=end == count,
    )


# --- what goes in ------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextFile:
    """Another open file's text shown to the model (the workspace head's chunk of it)."""

    path: str
    text: str


@dataclass
class EditContext:
    """Everything a format lays out."""

    region: EditableRegion
    path: str
    """The current file's path as shown (relative to the workspace root when known)."""
    language_id: str | None
    hunks: Sequence[tuple[str, Hunk]] = ()
    """Recent edits as (path shown, hunk), oldest first, this file's and other files'."""
    files: Sequence[ContextFile] = ()
    special_tokens: Sequence[str] = ()
    """The model family's special tokens (defused in document text)."""

    def defuse(self, text: str) -> str:
        """`text` with every marker and special token broken up (a zero-width space after
        the first character), so it reads as text."""
        if "<" not in text:
            return text
        for token in sorted({*_MARKERS, IM_START, IM_END, *self.special_tokens}, key=len)[::-1]:
            if token and token in text:
                text = text.replace(token, token[0] + _ZWSP + token[1:])
        return text

    @property
    def fence(self) -> str:
        """The code fence's info string: the language's name (or nothing)."""
        language = syntax.find_language(self.language_id, self.path)
        return language.id if language is not None else (self.language_id or "")

    def region_with_cursor(self, marker: str) -> str:
        region = self.region
        cut = region.cursor
        return self.defuse(region.text[:cut]) + marker + self.defuse(region.text[cut:])

    def diffs(self) -> list[tuple[str, str]]:
        """(path, unified diff) of each recent hunk, oldest first, empty ones left out."""
        out = []
        for path, hunk in self.hunks:
            diff = unified_diff(hunk, path)
            if diff:
                out.append((path, self.defuse(diff)))
        return out


def display_path(uri: str, root: str | None) -> str:
    """`uri` as a path, relative to the workspace folder `root` when inside it."""
    path = uri_to_path(uri)
    if root:
        base = uri_to_path(root).rstrip("/\\")
        if base and path.startswith(base) and path[len(base) : len(base) + 1] in ("/", "\\"):
            return path[len(base) + 1 :] or path
    return path


# --- formats ----------------------------------------------------------------------------


@dataclass
class EditPrompt:
    """A rendered next-edit prompt, and how to read the region back out of the answer."""

    format: str
    parts: list[PromptPart]
    closing: str
    """What the answer writes right after the region (the stop rule looks for it)."""
    eos_closes: bool
    """An end-of-sequence (a stop token) ends the region too."""
    strip: tuple[str, ...] = ()
    """Markers the model may echo inside the region (taken out)."""
    answer: str = ""
    """What the region's rewrite is expected to spell, closing included (the copy source)."""
    stops: tuple[str, ...] = field(default_factory=tuple)

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.parts)

    def closed(self, output: str) -> bool:
        """Whether `output` has finished writing the region."""
        return self.closing in output or output.startswith(self.closing.lstrip("\n"))

    def region_of(self, output: str, ended: bool) -> str | None:
        """The region the answer wrote; None when it did not finish it (cut off mid-region).
        `ended`: generation stopped at an end-of-sequence token."""
        bare = self.closing.lstrip("\n")
        if bare and output.startswith(bare):
            region = ""
        elif self.closing in output:
            region = output[: output.index(self.closing)]
        elif ended and self.eos_closes:
            region = output.removesuffix("\n")
        else:
            return None
        for marker in self.strip:
            region = region.replace(marker, "")
        return region


def _marker(text: str) -> PromptPart:
    return PromptPart(text, "marker")


def _text(text: str) -> PromptPart:
    return PromptPart(text, "context")


def _instruct(context: EditContext) -> EditPrompt:
    region, fence = context.region, context.fence
    user: list[str] = []
    for file in context.files:
        user.append(f"{file.path}:\n```{fence}\n{context.defuse(file.text)}\n```\n\n")
    if region.before:
        user.append(f"The lines above the region in {context.path}:\n```{fence}\n")
        user.append(context.defuse(region.before) + "```\n\n")
    if region.after:
        user.append(
            f"The lines below the region:\n```{fence}\n{context.defuse(region.after)}\n```\n\n"
        )
    between = " (between those lines)" if region.before or region.after else ""
    user.append(f"The region of {context.path} to rewrite{between}:\n```{fence}\n")
    user.append(context.defuse(region.text) + "\n```\n\n")
    diffs = context.diffs()
    if diffs:
        joined = "\n".join(diff for _, diff in diffs)
        user.append(f"My recent edits, oldest first:\n```diff\n{joined}\n```\n\n")
    line_start = region.text.rfind("\n", 0, region.cursor) + 1
    line_end = region.text.find("\n", region.cursor)
    cursor_line = region.text[line_start : line_end if line_end >= 0 else len(region.text)]
    where = (
        f"the line `{context.defuse(cursor_line.strip())}`"
        if cursor_line.strip()
        else (
            f"line {region.text.count(chr(10), 0, region.cursor) + 1} of the region, which is blank"
        )
    )
    user.append(
        f"My cursor is on {where}. Rewrite the region as it should be after my next edit, in "
        f"one ```{fence} block."
    )
    system = (
        "You are a code editor that predicts a developer's next edit from their recent edits "
        "and the code around their cursor, and answers with the rewritten code only. You are "
        "shown the region of a file to rewrite, the lines around it and the developer's recent "
        "edits. Rewrite the region as it should be after their next edit: finish the change "
        "their recent edits started (a renamed name used elsewhere, a new field or parameter "
        "to pass on, a pattern to repeat), and keep every other line exactly as it is. Answer "
        "with the whole region in one code block and nothing else; if nothing needs to "
        "change, write the region unchanged."
    )
    parts = [
        _marker(IM_START),
        _text(f"system\n{system}"),
        _marker(IM_END),
        _text("\n"),
        _marker(IM_START),
        _text("user\n" + "".join(user)),
        _marker(IM_END),
        _text("\n"),
        _marker(IM_START),
        _text(f"assistant\n```{fence}\n"),
    ]
    closing = "\n```"
    return EditPrompt("instruct", parts, closing, True, (), context.defuse(region.text) + closing)


def _zeta(context: EditContext) -> EditPrompt:
    region = context.region
    events = "".join(
        f'User edited "{path}":\n```diff\n{diff}\n```\n\n' for path, diff in context.diffs()
    )
    opening = f"```{context.path}\n" + (f"{START_OF_FILE}\n" if region.at_file_start else "")
    opening += context.defuse(region.before) + f"{REGION_START}\n"
    excerpt = opening + context.region_with_cursor(CURSOR) + f"\n{REGION_END}"
    if region.after:
        excerpt += "\n" + context.defuse(region.after)
    excerpt += "\n```"
    instruction = (
        "You help a programmer by predicting their next edit. Read the edits they made, then "
        "rewrite the excerpt's editable region the way they will edit it next, minding where "
        "their cursor is."
    )
    text = (
        f"### Instruction:\n{instruction}\n\n### User Edits:\n\n{events}"
        f"### User Excerpt:\n\n{excerpt}\n\n### Response:\n\n{opening}"
    )
    closing = f"\n{REGION_END}"
    return EditPrompt(
        "zeta", [_text(text)], closing, False, (CURSOR,), context.defuse(region.text) + closing
    )


def _sweep(context: EditContext) -> EditPrompt:
    region, path = context.region, context.path
    parts: list[PromptPart] = []
    for file in context.files:
        parts += [_marker(FILE_SEP), _text(f"{file.path}\n{context.defuse(file.text)}\n")]
    own_latest: Hunk | None = None
    for shown, hunk in context.hunks:
        if shown == path:
            own_latest = hunk
        old = context.defuse(hunk.old.removesuffix("\n"))
        new = context.defuse(hunk.new.removesuffix("\n"))
        parts += [_marker(FILE_SEP), _text(f"{shown}.diff\noriginal:\n{old}\nupdated:\n{new}\n")]
    current = context.defuse(region.text)
    original = current
    if own_latest is not None and own_latest.new and region.text.count(own_latest.new) == 1:
        original = context.defuse(region.text.replace(own_latest.new, own_latest.old))
    parts += [
        _marker(FILE_SEP),
        _text(f"original/{path}\n{original}\n"),
        _marker(FILE_SEP),
        _text(f"current/{path}\n{current}\n"),
        _marker(FILE_SEP),
        _text(f"updated/{path}\n"),
    ]
    return EditPrompt("sweep", parts, FILE_SEP, True, (), current + "\n")


def _instinct(context: EditContext) -> EditPrompt:
    region = context.region
    snippets = "\n".join(
        f"{CONTEXT_FILE} {file.path}\n{SNIPPET}\n{context.defuse(file.text)}"
        for file in context.files
    )
    edits = "\n".join(
        f'User edited file "{path}"\n\n```diff\n{diff}\n```'
        for path, diff in reversed(context.diffs())
    )
    excerpt = context.defuse(region.before) + f"{REGION_START}\n"
    excerpt += context.region_with_cursor(CURSOR) + f"\n{REGION_END}\n"
    if region.after:
        excerpt += context.defuse(region.after) + "\n"
    system = (
        "You are Instinct, a next-edit predictor. Given context from the developer's files "
        "(### Context), their most recent edits as unified diffs, newest first (### User "
        "Edits), and an excerpt of their current file (### User Excerpt) in which the lines "
        f"between {REGION_START} and {REGION_END} may be edited and {CURSOR} marks the "
        "cursor, write the editable region as the developer will have it after their next "
        "edit. Output only the region's code, without the markers, keep the existing style, "
        "and do not undo the developer's latest change."
    )
    user = (
        "Predict the developer's next change from the excerpt, the edits and the context, and "
        "rewrite the editable region with it; it may add, delete or modify code.\n\n"
        f"### Context:\n{snippets}\n\n### User Edits:\n\n{edits}\n\n"
        f"### User Excerpt:\n{context.path}\n\n{excerpt}```\n### Response:"
    )
    parts = [
        _marker(IM_START),
        _text(f"system\n{system}"),
        _marker(IM_END),
        _text("\n"),
        _marker(IM_START),
        _text(f"user\n{user}"),
        _marker(IM_END),
        _text("\n"),
        _marker(IM_START),
        _text("assistant\n"),
    ]
    return EditPrompt(
        "instinct",
        parts,
        IM_END,
        True,
        (CURSOR, REGION_START, REGION_END),
        context.defuse(region.text) + "\n",
    )


FORMATS = {"instruct": _instruct, "zeta": _zeta, "sweep": _sweep, "instinct": _instinct}
"""Format name -> how it renders an EditContext."""


def choose_format(configured: str, names: Sequence[str | None]) -> str:
    """The format for `configured` (`edits.format`); `auto` reads the model's names (preset,
    target, served model): one naming zeta, sweep or instinct gets that model's format,
    everything else (the Qwen2.5-Coder Instruct models quickdraft ships) `instruct`."""
    if configured != "auto":
        return configured
    for name in names:
        lowered = (name or "").lower()
        for model in ("zeta", "sweep", "instinct"):
            if model in lowered:
                return model
    return "instruct"


def render_edit_prompt(format_name: str, context: EditContext) -> EditPrompt:
    """The prompt of `format_name` for `context`."""
    return FORMATS[format_name](context)


def _runs(lines: Sequence[str], tail: Sequence[str]) -> list[int]:
    """The indices just past each occurrence of `tail` in `lines`."""
    n = len(tail)
    return [j for j in range(n, len(lines) + 1) if list(lines[j - n : j]) == list(tail)]


def overrun_start(region: EditableRegion, output: str) -> int | None:
    """Where `output` (the answer so far) goes on past the region: the offset of the first
    whole non-blank line written after the region's last non-blank lines were written again,
    when the answer did not close there. A small model that reads on into the file writes its
    next lines, or makes new ones up; every token of that is decode time spent on text that
    would be cut. The tail is the region's last 2-6 non-blank lines, as many as make it occur
    once in the region (a `}` closes many blocks); where none is unique, its last occurrence
    counts. None while the answer stays within the region. (An edit that adds lines after the
    region's last lines is cut there too: the region ends at a statement boundary well below
    the cursor, so that is rare.)"""
    old = [line.rstrip() for line in region.text.splitlines() if line.strip()]
    if len(old) < 2 or "\n" not in output:
        return None
    for size in range(2, min(6, len(old)) + 1):
        tail = old[-size:]
        if len(_runs(old, tail)) == 1:
            break
    occurrences = len(_runs(old, tail))
    complete = output[: output.rindex("\n") + 1]
    starts: list[int] = []  # offset of each whole non-blank line written
    written: list[str] = []
    offset = 0
    for line in lines_with_breaks(complete):
        if line.strip():
            starts.append(offset)
            written.append(line.rstrip())
        offset += len(line)
    ends = _runs(written, tail)
    if len(ends) < occurrences:
        return None
    past = ends[occurrences - 1]
    return starts[past] if past < len(written) else None
