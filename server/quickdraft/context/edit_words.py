"""`word`: one word changed inside a comment or a string -> the same word in the file's other
comments and strings; `text`: any other change inside one -> the same text in the others.

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
one the case of which cannot be carried over is left.

`text` takes what `word` leaves: a change in prose that is not one word (`"github-actions[bot]"`
-> `"pr-submit[bot]"`, `Whats` -> `What's`, a phrase reworded). The characters that changed,
widened to whole words and one character more on each side (so `[bot]` or a closing quote
anchors it), of TEXT_MIN_CHARS at least, on one line, are replayed where the same text stands in
another comment or string, with `repeat`'s confidence (and its REPEAT_FAR less outside the
edit's own top-level definition: the floor exactly, shown; until 2026-12-07 a rounding error
kept those under it). With the rules alone it added 3 proposals on the tuned
histories (371 cases) and 1 on those held out earlier (360), all exact, none on one-hunk
commits. Pure functions; offsets are code points.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from quickdraft.context.edit_rules import (
    CONFIDENCE,
    REPEAT_FAR,
    REPEAT_MAX_SITES,
    Candidate,
    LatestEdit,
    TextEdit,
    Tree,
    top_level,
)

WORD_CHARS = re.compile(r"\w")
WORD = re.compile(r"\w+\Z")
TYPO_MIN_CHARS = 6
TEXT_TYPO_MIN_CHARS = 4
"""The `text` rule's typo fixes may be shorter words: its text is five characters or more."""
TYPO_MAX_DISTANCE = 2
PROSE_TYPES = frozenset({"comment", "string"})
CODE_IN_PROSE = frozenset({"interpolation"})
"""Nodes inside a string that are code again (an f-string's replacement fields)."""
TEXT_MIN_CHARS = 5
"""The shortest text (less spaces) the `text` rule replays: shorter is too common to be the
same change elsewhere."""
QUOTES_AND_BREAKS = "\"'\n"
CODE_CHARS = re.compile(r"[\[\](){}<>/\\@#$%^&*=+|~`_\d-]")
"""Characters that make prose read as code (a path, a call, a tag, a flag, a number)."""
DOTTED = re.compile(r"[^\W\d]\w*\.[^\W\d]")
"""A dotted name (`tool.poetry`, `self.x`): code, where a sentence's full stop has a space."""
PROSE_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")
"""A word of prose: letters, with an apostrophe inside (`What's`); punctuation around it is not
part of it (`(agent)` is `agent`)."""


def common_ends(old: str, new: str) -> tuple[int, int]:
    """(characters `old` and `new` share at the start, characters they share at the end after
    those): what lies between them changed."""
    limit = min(len(old), len(new))
    head = 0
    while head < limit and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < limit - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return head, tail


def changed_word(old: str, new: str) -> tuple[int, str, str] | None:
    """(offset in `old`, the word there, the word that replaced it) when `old` and `new` differ
    in one run of word characters only, else None."""
    head, tail = common_ends(old, new)
    while head > 0 and WORD_CHARS.match(old[head - 1]):
        head -= 1
    while tail > 0 and WORD_CHARS.match(old[len(old) - tail]):
        tail -= 1
    old_word, new_word = old[head : len(old) - tail], new[head : len(new) - tail]
    if not (WORD.match(old_word) and WORD.match(new_word)) or old_word == new_word:
        return None
    return head, old_word, new_word


def _words_changed(old_text: str, new_text: str) -> tuple[list[str], list[str]]:
    """The space-separated words of the runs that differ between the two: (old's, new's)."""
    old, new = old_text.split(), new_text.split()
    changed = [
        (old[i1:i2], new[j1:j2])
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
            None, old, new, autojunk=False
        ).get_opcodes()
        if tag != "equal"
    ]
    return [w for a, _ in changed for w in a], [w for _, b in changed for w in b]


def _reads_as_code(word: str) -> bool:
    """A symbol, or a name as code spells it (`_names_code`)."""
    return bool(CODE_CHARS.search(word)) or _names_code(word)


def _names_code(word: str) -> bool:
    """A dotted name, or a word with an underscore, a digit or an inner capital (an acronym
    aside: `API` is prose). Brackets put around a word make no name of it (`(agent)`)."""
    return bool(DOTTED.search(word)) or any(
        _code_like(w) and not w.isupper() for w in PROSE_WORD.findall(word)
    )


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
    return _code_like(old_word) or typo_fixed(old_word, new_word)


def typo_fixed(old_word: str, new_word: str, min_chars: int = TYPO_MIN_CHARS) -> bool:
    """Whether `new_word` fixes a typo in `old_word`: `min_chars` letters or more, at most
    TYPO_MAX_DISTANCE changed, not only its ending."""
    old_word, new_word = old_word.lower(), new_word.lower()
    if old_word.startswith(new_word) or new_word.startswith(old_word):
        return False  # an ending changed (`containers` -> `container`): another word, no typo
    return len(old_word) >= min_chars and _distance(old_word, new_word) <= TYPO_MAX_DISTANCE


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


def change_in_prose(
    edit: LatestEdit,
    find: Callable[[str, str], tuple[int, str, str] | None],
    means_one_thing: Callable[[str, str], bool],
) -> tuple[str, str] | None:
    """(old, new) of the change `find` sees in the latest edit, where it lies in prose before
    and after it and `means_one_thing`; else None."""
    changed = find(edit.old, edit.new)
    if changed is None or edit.grammar is None or edit.after_tree.root is None:
        return None
    offset, old, new = changed
    start = edit.start + offset
    if not means_one_thing(old, new):
        return None
    if in_prose(edit.before_tree, start, start + len(old)) and in_prose(
        edit.after_tree, start, start + len(new)
    ):
        return old, new
    return None


def word_candidates(edit: LatestEdit) -> list[Candidate]:
    changed = change_in_prose(edit, changed_word, specific)
    if changed is None:
        return []
    old_word, new_word = changed
    after = edit.after_tree
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


def changed_text(old: str, new: str) -> tuple[int, str, str] | None:
    """(offset in `old`, the text there, the text that replaced it): the characters that differ,
    widened to whole words and by one more character on each side that is not a quote or a
    line break; None when that spans lines or holds no word."""
    head, tail = common_ends(old, new)
    start, end, new_end = head, len(old) - tail, len(new) - tail
    while start > 0 and WORD_CHARS.match(old[start - 1]):
        start -= 1
    while end < len(old) and WORD_CHARS.match(old[end]):
        end, new_end = end + 1, new_end + 1
    if start > 0 and old[start - 1] not in QUOTES_AND_BREAKS:
        start -= 1
    if end < len(old) and old[end] not in QUOTES_AND_BREAKS:
        end, new_end = end + 1, new_end + 1
    old_text, new_text = old[start:end], new[start:new_end]
    if "\n" in old_text or "\n" in new_text or not WORD_CHARS.search(old_text):
        return None
    if len(old_text.strip()) < TEXT_MIN_CHARS:
        return None
    return start, old_text, new_text


def names_something(old_text: str, new_text: str) -> bool:
    """Whether text changed this way means the same change wherever it stands, as `specific`
    says of one word: the words it changes read as code (before: a symbol, or a name as code
    spells it, `"github-actions[bot]"`; after: such a name, `data.` -> `tool.poetry.`), the
    change lies within a word (`Whats` -> `What's`), or each word it changes is a typo fixed.
    Words it keeps do not count: `Taken from Pydantic v1 as is` -> `Adapted from Pydantic v1`
    is wording, as are a phrase reworded (`report` -> `the report`) and a word wrapped
    (`agent` -> `(agent)`): no candidate."""
    old_words, new_words = _words_changed(old_text, new_text)
    if any(_reads_as_code(w) for w in old_words) or any(_names_code(w) for w in new_words):
        return True
    head, tail = common_ends(old_text, new_text)
    if head > 0 and tail > 0 and old_text[head - 1].isalpha() and old_text[-tail].isalpha():
        return True  # within a word (`write‑up` -> `write-up`), not around one (`(agent)`)
    old_words, new_words = PROSE_WORD.findall(old_text), PROSE_WORD.findall(new_text)
    if len(old_words) != len(new_words):
        return False
    changed = [(a, b) for a, b in zip(old_words, new_words, strict=True) if a != b]
    return bool(changed) and all(typo_fixed(a, b, TEXT_TYPO_MIN_CHARS) for a, b in changed)


def text_candidates(edit: LatestEdit) -> list[Candidate]:
    changed = change_in_prose(edit, changed_text, names_something)
    if changed is None:
        return []  # a change made in code is `repeat`'s, not this rule's
    old_text, new_text = changed
    after = edit.after_tree
    home = top_level(after, edit.start)
    sites: list[int] = []
    at = edit.after.find(old_text)
    while at >= 0:
        outside = not (edit.start <= at < edit.new_end)
        if outside and in_prose(after, at, at + len(old_text)):
            sites.append(at)
            if len(sites) > REPEAT_MAX_SITES:
                return []  # text this common is not one thing changed
        at = edit.after.find(old_text, at + 1)
    note = f"{old_text.strip()} -> {new_text.strip()}"
    return [
        Candidate(
            "text",
            TextEdit(site, site + len(old_text), new_text),
            round(CONFIDENCE["text"] - (REPEAT_FAR if top_level(after, site) != home else 0), 3),
            note,
        )
        for site in sites
    ]
