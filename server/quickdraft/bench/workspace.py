"""The workspace scenario of `quickdraft bench --typing` planned: which held-out files are open,
where the cursor goes in each, and every message the editor sends, in order. Pure functions of
the holes (holes.py picks them); workspace_replay.py sends the steps to a real server.

The plan, for N files with a hole each (sample_holes: languages round robin, each file once):

1. `didOpen` all N files (each without its hole's hidden text), then a pause (`open`) in which
   the server can read them;
2. visit each in turn: `didFocus` at the hole's cursor, a thought pause (`think`), one
   character typed (the hidden text's first), an inline completion request (`visit`);
3. come back to a visited file: `didFocus` where its cursor was left, one more character typed,
   a request (`revisit`);
4. move 20-40 lines within that file: `didFocus` at a `line` hole there (the rest of a line from
   a token), a thought pause, that rest of the line replaced by its first character (as
   selecting to the end of the line and typing does), a request (`move`);
5. a file never opened before: `didOpen`, `didFocus` at its hole, its first hidden character
   typed, a request at once (`cold`, the baseline).

Offsets are code points into each document as the editor holds it at that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quickdraft.bench.holes import Hole, candidate_spans, offset_to_position

MOVE_LINES = (20, 40)
"""How far (in lines, either way) the cursor moves within a visited file."""
MOVE_AIM = 30
"""The distance preferred among the spots in range."""
ASK_KINDS = ("visit", "revisit", "move", "cold")


@dataclass(frozen=True)
class Step:
    """One thing the editor does. `action`: `open` (didOpen), `pause`, `focus` (didFocus at
    `offset`), `edit` (didChange replacing `offset`..`end` with `text`), `ask` (an inline
    completion request at `offset`, awaited)."""

    action: str
    file: str | None = None
    """The document's repository-relative path (None for a pause)."""
    offset: int = 0
    end: int = 0
    text: str = ""
    seconds: float = 0.0
    label: str = ""
    """For `ask`: visit, revisit, move or cold; for `pause`: open or think."""


@dataclass(frozen=True)
class MoveSpot:
    offset: int
    """The cursor: the start of a `line` hole in the document as it is after the revisit."""
    end: int
    """The end of that line's rest (replaced by its first character)."""
    line: int
    distance: int
    """Lines from the revisited spot (negative: above it)."""


@dataclass
class WorkspacePlan:
    visits: list[Hole]
    cold: Hole | None
    revisit: int | None
    """Index into `visits` of the file come back to (None only without visits)."""
    move: MoveSpot | None
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        revisited = self.visits[self.revisit] if self.revisit is not None else None
        return {
            "files": [hole.file for hole in self.visits],
            "languages": [hole.language for hole in self.visits],
            "cold": self.cold.file if self.cold else None,
            "revisit": revisited.file if revisited else None,
            "move": (
                None
                if self.move is None or revisited is None
                else {
                    "file": revisited.file,
                    "line": self.move.line,
                    "distance": self.move.distance,
                }
            ),
            "notes": list(self.notes),
        }


def usable(hole: Hole) -> bool:
    """A hole the scenario can type two characters of: no CR in the document, and the hidden
    text starts with two characters on its first line, the first not blank."""
    head = hole.truth[:2]
    return (
        "\r" not in hole.text
        and len(head) == 2
        and "\n" not in head
        and not head[0].isspace()
        and not hole.truth.startswith("\r")
    )


CONTEXT_CHARS = (8000, 3000)
"""How much text before and after a cursor can reach a default prompt (about 1,500 tokens):
what makes two spots comparable in cost."""


def context_chars(hole: Hole) -> int:
    """How much of a default prompt the text around `hole`'s cursor can fill."""
    return min(hole.offset, CONTEXT_CHARS[0]) + min(len(hole.text) - hole.offset, CONTEXT_CHARS[1])


def choose_files(holes: list[Hole], count: int) -> tuple[list[Hole], Hole | None]:
    """The first usable hole of each file, in sampling order: `count` to visit; and for the
    cold baseline, of the other files' first holes, the one whose surroundings fill a prompt
    most like the visits' (their median), so that it costs what a visit would cost cold (None
    when there is no file left for it)."""
    seen: set[str] = set()
    picked: list[Hole] = []
    for hole in holes:
        if hole.file in seen or not usable(hole):
            continue
        seen.add(hole.file)
        picked.append(hole)
    visits, rest = picked[:count], picked[count:]
    if not rest:
        return visits, None
    sizes = sorted(context_chars(hole) for hole in visits)
    median = sizes[len(sizes) // 2] if sizes else 0
    cold = min(rest, key=lambda hole: (abs(context_chars(hole) - median), rest.index(hole)))
    return visits, cold


def move_spot(text: str, language: str, from_offset: int) -> MoveSpot | None:
    """A `line` hole 20-40 lines from `from_offset` in `text` (the one nearest 30 lines away,
    below before above), whose rest of line starts with a character that is not blank; None
    when the file has none."""
    from_line = offset_to_position(text, from_offset)[0]
    data = text.encode("utf-8")
    best: tuple[tuple[int, int, int], MoveSpot] | None = None
    for span in candidate_spans(data, language)["line"]:
        start = len(data[: span.start].decode("utf-8"))
        end = len(data[: span.end].decode("utf-8"))
        line = offset_to_position(text, start)[0]
        distance = line - from_line
        if not MOVE_LINES[0] <= abs(distance) <= MOVE_LINES[1]:
            continue
        rest = text[start:end]
        if not rest or rest[0].isspace() or "\r" in rest:
            continue
        key = (abs(abs(distance) - MOVE_AIM), int(distance < 0), start)
        if best is None or key < best[0]:
            best = (key, MoveSpot(start, end, line, distance))
    return best[1] if best else None


def plan_workspace(
    holes: list[Hole], count: int, *, open_pause_s: float, think_s: float
) -> WorkspacePlan:
    """The files, spots and steps of the scenario, from sampled holes (see the module doc).
    The file come back to is the first visited one with a spot to move to (the first visited
    one when none has)."""
    visits, cold = choose_files(holes, count)
    plan = WorkspacePlan(visits, cold, None, None)
    if not visits:
        return plan
    if len(visits) < count:
        plan.notes.append(f"only {len(visits)} files with a usable hole (asked for {count})")
    if cold is None:
        plan.notes.append("no file left for the cold baseline")
    moves: dict[int, MoveSpot | None] = {}
    for index, hole in enumerate(visits):
        moves[index] = move_spot(revisited_text(hole), hole.language, hole.offset + 2)
        if moves[index] is not None:
            break
    plan.revisit = next((i for i, m in moves.items() if m is not None), 0)
    plan.move = moves.get(plan.revisit)
    if plan.move is None:
        plan.notes.append(
            f"no line hole {MOVE_LINES[0]}-{MOVE_LINES[1]} lines from the cursor in any visited"
            " file: no move"
        )

    steps = plan.steps
    steps += [Step("open", hole.file) for hole in visits]
    steps.append(Step("pause", seconds=open_pause_s, label="open"))
    for hole in visits:
        steps += [
            Step("focus", hole.file, hole.offset),
            Step("pause", seconds=think_s, label="think"),
            Step("edit", hole.file, hole.offset, hole.offset, hole.truth[0]),
            Step("ask", hole.file, hole.offset + 1, label="visit"),
        ]
    back = visits[plan.revisit]
    cursor = back.offset + 1
    steps += [
        Step("focus", back.file, cursor),
        Step("edit", back.file, cursor, cursor, back.truth[1]),
        Step("ask", back.file, cursor + 1, label="revisit"),
    ]
    if plan.move is not None:
        move = plan.move
        first = text_at_move(back, move)
        steps += [
            Step("focus", back.file, move.offset),
            Step("pause", seconds=think_s, label="think"),
            Step("edit", back.file, move.offset, move.end, first),
            Step("ask", back.file, move.offset + 1, label="move"),
        ]
    if cold is not None:
        steps += [
            Step("open", cold.file),
            Step("focus", cold.file, cold.offset),
            Step("edit", cold.file, cold.offset, cold.offset, cold.truth[0]),
            Step("ask", cold.file, cold.offset + 1, label="cold"),
        ]
    return plan


def revisited_text(hole: Hole) -> str:
    """The document of the file come back to, once its two characters are typed."""
    return hole.text[: hole.offset] + hole.truth[:2] + hole.text[hole.offset :]


def text_at_move(hole: Hole, move: MoveSpot) -> str:
    """The character typed at the move spot: the first of the line's rest there."""
    return revisited_text(hole)[move.offset]
