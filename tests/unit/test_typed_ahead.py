"""The typed-ahead cache: the rest of a suggestion while it is typed, prefetched answers."""

from quickdraft.lsp.typed_ahead import TypedAhead, TypedAheadCache


def test_typed_ahead_serves_the_rest_of_the_suggestion():
    cache = TypedAheadCache()
    cache.remember("file:///a.py", "x = ", "compute(a, b)", "\n")
    assert cache.lookup("file:///a.py", "x = ", "\n").text == "compute(a, b)"
    assert cache.lookup("file:///a.py", "x = comp", "\n").text == "ute(a, b)"
    assert cache.lookup("file:///a.py", "x = compute(a", "\n") == TypedAhead(", b)", "typed-ahead")


def test_typed_ahead_invalidates_on_a_mismatch():
    cache = TypedAheadCache()
    cache.remember("file:///a.py", "x = ", "compute(a, b)", "\n")
    assert cache.lookup("file:///a.py", "x = cox", "\n") is None
    # forgotten: even the matching text doesn't come back
    assert cache.lookup("file:///a.py", "x = comp", "\n") is None


def test_typed_ahead_other_invalidations():
    cache = TypedAheadCache()
    cache.remember("file:///a.py", "x = ", "compute()", "\n")
    assert cache.lookup("file:///b.py", "x = c", "\n") is None  # other document
    assert cache.lookup("file:///a.py", "x = c", "\ny = 2\n") is None  # suffix changed
    cache.remember("file:///a.py", "x = ", "compute()", "\n")
    assert cache.lookup("file:///a.py", "y", "\n") is None  # deleted/moved away
    cache.remember("file:///a.py", "x = ", "compute()", "\n")
    assert cache.lookup("file:///a.py", "x = compute()", "\n") is None  # typed it all
    cache.remember("file:///a.py", "x = ", "compute()", "\n")
    cache.invalidate("file:///a.py")
    assert cache.lookup("file:///a.py", "x = c", "\n") is None


def test_typed_ahead_keeps_a_bounded_number_of_documents():
    cache = TypedAheadCache(max_documents=2)
    for name in ("a", "b", "c"):
        cache.remember(f"file:///{name}.py", "", "text")
    assert cache.lookup("file:///a.py", "t") is None
    assert cache.lookup("file:///c.py", "t").text == "ext"


def test_a_prefetched_answer_waits_for_its_text_and_wins_there():
    cache = TypedAheadCache()
    cache.remember("file:///a.py", "x = ", "f(1)\ny = ", "\n")
    # Computed ahead: what follows once the suggestion is accepted.
    cache.remember("file:///a.py", "x = f(1)\ny = ", "g(2)", "\n", source="prefetch")
    cache.remember("file:///a.py", "x = f(1)", "  # one", "\n", source="prefetch")
    assert cache.lookup("file:///a.py", "x = f", "\n").text == "(1)\ny = "  # still typing
    first_line = cache.lookup("file:///a.py", "x = f(1)", "\n")
    assert first_line == TypedAhead("  # one", "prefetch")  # the longer prefix wins
    accepted = cache.lookup("file:///a.py", "x = f(1)\ny = ", "\n")
    assert accepted == TypedAhead("g(2)", "prefetch")
    assert cache.lookup("file:///a.py", "x = f(1)\ny = g", "\n").text == "(2)"
    assert cache.lookup("file:///a.py", "z", "\n") is None  # moved away: all forgotten
    assert cache.lookup("file:///a.py", "x = f(1)\ny = ", "\n") is None


def test_a_prefetch_that_found_nothing_to_add_answers_nothing_at_once():
    cache = TypedAheadCache()
    cache.remember("file:///a.py", "x = ", "f(1)", "\n")
    cache.remember("file:///a.py", "x = f(1)", "", "\n", source="prefetch")
    cache.remember("file:///a.py", "y = ", "", "\n")  # a request's empty answer: not kept
    assert cache.lookup("file:///a.py", "x = f", "\n").text == "(1)"
    assert cache.lookup("file:///a.py", "x = f(1)", "\n") == TypedAhead("", "prefetch")
    assert cache.lookup("file:///a.py", "x = f(1) ", "\n") is None  # typed on: ask the model
    assert cache.lookup("file:///a.py", "y = ", "\n") is None


def test_an_answer_stopped_unsure_stays_unsure_while_its_text_is_typed():
    cache = TypedAheadCache()
    cache.remember("file:///a.py", "x = ", "comp", "\n", source="unsure", confidence=0.05)
    assert cache.lookup("file:///a.py", "x = ", "\n") == TypedAhead("comp", "unsure", 0.05)
    assert cache.lookup("file:///a.py", "x = co", "\n") == TypedAhead("mp", "unsure", 0.05)
    assert cache.lookup("file:///a.py", "x = cx", "\n") is None  # off its text: asked afresh
    # One that wrote nothing answers nothing, there only.
    cache.remember("file:///a.py", "y = ", "", "\n", source="unsure", confidence=0.01)
    assert cache.lookup("file:///a.py", "y = ", "\n") == TypedAhead("", "unsure", 0.01)
    assert cache.lookup("file:///a.py", "y = 1", "\n") is None
    cache.remember("file:///a.py", "y = ", "", "\n")  # a plain empty answer is not kept
    assert cache.lookup("file:///a.py", "y = ", "\n") is None
