"""Set up once for every test process: torch's first `cos`, on one thread, before any forward.

Tests compare forwards bitwise, and a process's first `cos` run on both threads can come out
inexact in one thread's half (`decoder_loop.settle_rotary_math`, which the server's loading
calls for the same reason)."""

from quickdraft.models import decoder_loop

decoder_loop.settle_rotary_math()
