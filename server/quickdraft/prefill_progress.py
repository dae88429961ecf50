"""How far a prefill has got, for whoever waits on it: the language server shows a long one
("reading app.py: 1,280 of 5,800 tokens") so a cold file's first suggestion does not look like
nothing happening.

The runners report each prefill chunk here (`report`, from `decoding.runner.extend_in_chunks`,
which every runner's prefill goes through); the code running a request on a thread listens
(`listening`). A context variable, as a trace is, so the dozen calls between a request and
the runner need not each carry a callback; a thread nobody listens on reports to nobody.
Imports nothing (the language server imports it before any model code).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

PrefillListener = Callable[[int, int], None]
"""(tokens computed so far, tokens to compute) of one prefill; called on the thread that runs it,
so it must be quick (store the numbers; show them elsewhere)."""

_listener: ContextVar[PrefillListener | None] = ContextVar("prefill_listener", default=None)


@contextlib.contextmanager
def listening(listener: PrefillListener) -> Iterator[None]:
    """Within it, prefills on this thread report to `listener`."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def report(computed: int, total: int) -> None:
    """A prefill of `total` new tokens has computed `computed` of them."""
    listener = _listener.get()
    if listener is not None:
        listener(computed, total)
