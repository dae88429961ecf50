"""What keeps a rule's candidate next edit from being shown (context/edit_rules.py proposes).

In order, cheapest first; the first that applies removes the candidate and is counted:

- `floor`: its confidence is below `edit_rules.FLOOR` (abstaining is the default).
- `other-document`: it edits another document and the caller can only show this one's.
- `undo`: it touches the lines of the latest edit, or turns the document back into what it was
  before it.
- `parse`: the document with it applied has more tree-sitter errors than without it.

(The issue's third veto, the target model's log-probability change over the changed tokens, is
not here yet. The rules are precise on the tuned histories without it (84 %), not on histories
nobody tuned on (55 %, `repeat` the weakest): see the README.)

The first candidate, best first, that no veto removes is shown; none shown is the answer "no
edit". Pure functions; offsets are code points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from quickdraft.context import syntax
from quickdraft.context.edit_rules import FLOOR, Candidate, LatestEdit

VETOES = ("floor", "other-document", "undo", "parse")


@dataclass
class Decision:
    """What the rules and the vetoes made of one latest edit."""

    shown: Candidate | None = None
    candidates: int = 0
    vetoed: dict[str, int] = field(default_factory=dict)
    """Veto name -> candidates it removed before one was shown."""
    parses: int = 0
    """Parses the `parse` veto made (tests count work, not time)."""

    @property
    def rule(self) -> str | None:
        return self.shown.rule if self.shown is not None else None

    @property
    def confidence(self) -> float | None:
        return self.shown.confidence if self.shown is not None else None


def applied(text: str, candidate: Candidate) -> str:
    edit = candidate.edit
    return text[: edit.start] + edit.text + text[edit.end :]


def veto(
    edit: LatestEdit, candidate: Candidate, *, other_documents: bool = False, floor: float = FLOOR
) -> tuple[str | None, bool]:
    """(the veto that removes `candidate`, or None; whether a parse was made)."""
    if candidate.confidence < floor:
        return "floor", False
    target = candidate.edit
    if target.uri is not None and target.uri != edit.uri:
        return (None if other_documents else "other-document"), False
    if (
        target.start < edit.new_end
        and edit.start < target.end
        or (target.start == target.end and edit.start <= target.start <= edit.new_end)
    ):
        return "undo", False
    result = applied(edit.after, candidate)
    if result == edit.before:
        return "undo", False
    grammar = edit.grammar
    if grammar is None:
        return None, False
    if syntax.parses_without_new_errors(edit.after, result, grammar) is False:
        return "parse", True
    return None, True


def vet(
    edit: LatestEdit,
    candidates: Sequence[Candidate],
    *,
    other_documents: bool = False,
    floor: float = FLOOR,
) -> Decision:
    """The first of `candidates` (best first) that no veto removes, and what was removed.
    (`floor` 0: the best candidate whatever its confidence, as the bench's floor sweep asks.)"""
    decision = Decision(candidates=len(candidates))
    for candidate in candidates:
        reason, parsed = veto(edit, candidate, other_documents=other_documents, floor=floor)
        decision.parses += parsed
        if reason is None:
            decision.shown = candidate
            return decision
        decision.vetoed[reason] = decision.vetoed.get(reason, 0) + 1
    return decision
