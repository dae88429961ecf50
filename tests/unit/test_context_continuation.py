"""The first draft found by characters: what followed the text before the cursor elsewhere."""

from __future__ import annotations

from quickdraft.context.continuation import MIN_MATCH_CHARS, find_continuation

BEFORE = 'import type {KeywordCxt} from "../compile/validate"\nimport {CodeGen, Code, Name} from '


def test_the_longest_match_wins_and_its_continuation_is_returned():
    current = BEFORE + "\nexport const x = 1\n"
    other = 'import {x} from "../types"\nimport type {ScopeName, Name} from "../compile/codegen"\n'
    found = find_continuation(BEFORE, [("cur", current, len(BEFORE)), ("other", other, None)])
    assert found is not None and found.source == "other"
    assert found.text.startswith('"../compile/codegen"\n')
    assert found.match_chars == len("e, Name} from ")  # "Cod|e, ..." vs "Scop|e, ..."


def test_the_text_before_the_cursor_does_not_match_itself():
    current = BEFORE + '"../compile/codegen"\n'
    assert find_continuation(BEFORE, [("cur", current, len(BEFORE))]) is None
    # Elsewhere in the same document it does: earlier lines are fair game.
    current = 'import {CodeGen, Code, Name} from "./gen"\n' + current
    found = find_continuation(BEFORE, [("cur", current, len(current) - 21)])
    assert found is not None and found.text.startswith('"./gen"')


def test_short_matches_and_short_prefixes_give_nothing():
    assert find_continuation("x = ", [("a", "x = 1\n", None)]) is None
    tail = BEFORE[-(MIN_MATCH_CHARS - 1) :]
    assert find_continuation(BEFORE, [("a", "zzz" + tail + "42", None)]) is None
    assert find_continuation(BEFORE, [("a", "zzz" + BEFORE[-MIN_MATCH_CHARS:] + "42", None)])


def test_ties_go_to_the_first_document():
    text = "def area(width, height):\n    "
    docs = [
        ("first", "def area(width, height):\n    return 1\n", None),
        ("second", "def area(width, height):\n    return 2\n", None),
    ]
    assert find_continuation(text, docs).source == "first"
