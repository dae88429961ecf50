"""`word`: one word changed inside a comment or a string -> the same word in the file's other
comments and strings.

A typo fixed (`assignements` -> `assignments`), a name changed in a message or an example kept
as text (`'transcription_session.update'` -> `'session.update'`, a class renamed in code a test
holds in a string): the language binds nothing there, so the rename rule cannot follow the
change, but its other spellings in prose can be replayed. Only a word that is specific enough
to mean the same thing wherever it stands: one that reads as code (an underscore, a digit or an
inner capital: `transcription_session`, `PseudoFixtureDef`), or a fixed typo (a word of
TYPO_MIN_CHARS or more changed by at most TYPO_MAX_DISTANCE letters, not only at its end). A
plain English word changed for another (`Whether` -> `If`) or given another ending (`manager`
-> `manage`, `containers` -> `container`) is a change of wording, not of what the text names:
no candidate.

Each occurrence in a comment or a string (an f-string's `{...}` is code, not prose) becomes a
candidate, with its case carried over (`Assignement` -> `Assignment` where `assignement` was fixed, `FOO_BAR` -> `FOO_BAZ`);
one the case of which cannot be carried over is left. Pure functions; offsets are code points.
"""

from __future__ import annotations

import re

from quickdraft.context.edit_rules import (
    CONFIDENCE,
    REPEAT_MAX_SITES,
    Candidate,
    LatestEdit,
    TextEdit,
    Tree,
)

WORD_CHARS = re.compile(r"\w")
WORD = re.compile(r"\w+\Z")
TYPO_MIN_CHARS = 6
TYPO_MAX_DISTANCE = 2
PROSE_TYPES = frozenset({"comment", "string"})
CODE_IN_PROSE = frozenset({"interpolation"})
"""Nodes inside a string that are code again (an f-string's replacement fields)."""


def changed_word(old: str, new: str) -> tuple[int, str, str] | None:
    """(offset in `old`, the word there, the word that replaced it) when `old` and `new` differ
    in one run of word characters only, else None."""
    limit = min(len(old), len(new))
    head = 0
    while head < limit and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < limit - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    while head > 0 and WORD_CHARS.match(old[head - 1]):
        head -= 1
    while tail > 0 and WORD_CHARS.match(old[len(old) - tail]):
        tail -= 1
    old_word, new_word = old[head : len(old) - tail], new[head : len(new) - tail]
    if not (WORD.match(old_word) and WORD.match(new_word)) or old_word == new_word:
        return None
    return head, old_word, new_word


def _code_like(word: str) -> bool:
    return "_" in word or any(c.isdigit() for c in word) or any(c.isupper() for c in word[1:])


def _distance(a: str, b: str) -> int:
    """Levenshtein distance (short words only: this is quadratic)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def specific(old_word: str, new_word: str) -> bool:
    """Whether a word changed this way means the same change wherever the word stands."""
    if _code_like(old_word):
        return True
    old_word, new_word = old_word.lower(), new_word.lower()
    if old_word.startswith(new_word) or new_word.startswith(old_word):
        return False  # an ending changed (`containers` -> `container`): another word, no typo
    return len(old_word) >= TYPO_MIN_CHARS and _distance(old_word, new_word) <= TYPO_MAX_DISTANCE


def in_prose(tree: Tree, start: int, end: int) -> bool:
    """Whether `start`..`end` lies in a comment or a string, not in code inside one."""
    node = tree.at(start, end)
    while node is not None:
        if node.type in CODE_IN_PROSE:
            return False
        if node.type in PROSE_TYPES:
            return True
        node = node.parent
    return False


def with_case_of(found: str, old_word: str, new_word: str) -> str | None:
    """`new_word` spelled as `found` spells `old_word` (as is, its first letter in the other case,
    upper case), or None
    when `found` is spelled some other way."""
    if found == old_word:
        return new_word
    if found == old_word[:1].upper() + old_word[1:]:
        return new_word[:1].upper() + new_word[1:]
    if found == old_word[:1].lower() + old_word[1:]:
        return new_word[:1].lower() + new_word[1:]
    if found == old_word.upper():
        return new_word.upper()
    return None


def word_candidates(edit: LatestEdit) -> list[Candidate]:
    changed = changed_word(edit.old, edit.new)
    if changed is None or edit.grammar is None:
        return []
    offset, old_word, new_word = changed
    if not specific(old_word, new_word):
        return []
    start = edit.start + offset
    before, after = edit.before_tree, edit.after_tree
    if after.root is None or not (
        in_prose(before, start, start + len(old_word))
        and in_prose(after, start, start + len(new_word))
    ):
        return []
    pattern = re.compile(rf"(?<!\w){re.escape(old_word)}(?!\w)", re.IGNORECASE)
    sites: list[tuple[int, int, str]] = []
    for match in pattern.finditer(edit.after):
        if edit.start <= match.start() < edit.new_end:
            continue
        text = with_case_of(match.group(), old_word, new_word)
        if text is None or not in_prose(after, match.start(), match.end()):
            continue
        sites.append((match.start(), match.end(), text))
        if len(sites) > REPEAT_MAX_SITES:
            return []  # a word this common is not one thing renamed
    note = f"{old_word} -> {new_word}"
    return [
        Candidate("word", TextEdit(s, e, text), CONFIDENCE["word"], note) for s, e, text in sites
    ]
