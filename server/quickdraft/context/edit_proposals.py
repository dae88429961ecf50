"""Every rule's next-edit candidates for the latest edit, best first.

The rules, tried in this order until one has candidates: `rename`/`import` and `signature`
(context/edit_rules.py: what a name or a `def` binds), `parametrize` (a test's parameters
from its parametrize decorator, context/edit_pytest.py), `repeat` (the hunk's token change
replayed), `word` and `text` (a word, or other text, of a comment or string:
context/edit_words.py), `hoist` and `inline`
(a statement moved, context/edit_statements.py), an import that moved a name (edit_rules), and
last `lines` (the changed lines replayed where they stand word for word, edit_statements.py;
under the floor, measured only).
A hunk is one kind of change, so the first rule that recognises it speaks for it.
"""

from __future__ import annotations

from quickdraft.context.edit_pytest import parametrize_candidates
from quickdraft.context.edit_rules import (
    MAX_CANDIDATES,
    Candidate,
    LatestEdit,
    duplicate_import_candidates,
    rename_candidates,
    repeat_candidates,
    signature_candidates,
    token_change,
)
from quickdraft.context.edit_statements import (
    hoist_candidates,
    inline_candidates,
    lines_candidates,
)
from quickdraft.context.edit_words import text_candidates, word_candidates


def propose(edit: LatestEdit) -> list[Candidate]:
    """Every rule's candidates for `edit` in its own document, best first: by confidence, then
    nearest after the edit (then nearest above it). (In the documents that import what it
    changed: context/edit_importers.py.)"""
    change = token_change(edit)
    if change is None:
        return []
    candidates = rename_candidates(edit, change)
    if candidates is None:
        rules = (
            lambda: signature_candidates(edit),
            lambda: parametrize_candidates(edit),
            lambda: repeat_candidates(edit, change),
            lambda: word_candidates(edit),
            lambda: text_candidates(edit),
            lambda: hoist_candidates(edit),
            lambda: inline_candidates(edit),
            lambda: duplicate_import_candidates(edit),
            lambda: lines_candidates(edit),
        )
        candidates = next((found for rule in rules if (found := rule())), [])

    def order(candidate: Candidate) -> tuple[float, bool, int]:
        e = candidate.edit
        below = e.start >= edit.new_end
        distance = e.start - edit.new_end if below else edit.start - e.start
        return (-candidate.confidence, not below, distance)

    return sorted(candidates, key=order)[:MAX_CANDIDATES]
