"""The remote engine's state as requests and probes find it, told to listeners on changes only.

States: "ready" (the last request or probe got an answer) and "unavailable" (it failed; the
failure class, `RemoteEngineError.kind`, is part of the state). A listener hears each change of
state once, so the language server shows one message per failure state, not one per keystroke.
A failure that belongs to one request (`engine_down` False) changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from quickdraft.errors import RemoteEngineError

StatusListener = Callable[[str, str], None]
"""listener(state, message): called from whichever thread saw the change."""


class EngineStatus:
    def __init__(self, where: str) -> None:
        self.where = where
        self._lock = threading.Lock()
        self.state = "unknown"
        self.kind: str | None = None
        self.message = f"the completion engine at {where} has not been asked yet"
        self._listeners: list[StatusListener] = []

    @property
    def unavailable(self) -> bool:
        return self.state == "unavailable"

    def subscribe(self, listener: StatusListener) -> tuple[str, str]:
        """Hear every later change; returns the state and message as they are now."""
        with self._lock:
            self._listeners.append(listener)
            return self.state, self.message

    def unsubscribe_all(self) -> None:
        with self._lock:
            self._listeners.clear()

    def record_success(self) -> bool:
        """The engine answered. True when that is a change (it was unavailable or unknown)."""
        was = self.state
        return self._change(
            "ready",
            None,
            f"the completion engine at {self.where} answers again"
            if was == "unavailable"
            else f"the completion engine at {self.where} is ready",
        )

    def record_failure(self, error: RemoteEngineError) -> bool:
        """A request or probe failed. True when that is a new failure state."""
        if not error.engine_down:
            return False
        return self._change("unavailable", error.kind, str(error))

    def _change(self, state: str, kind: str | None, message: str) -> bool:
        with self._lock:
            if (self.state, self.kind) == (state, kind):
                if state == "unavailable":
                    self.message = message  # same failure, latest words; no new notice
                return False
            self.state, self.kind, self.message = state, kind, message
            listeners = list(self._listeners)
        for listener in listeners:
            listener(state, message)
        return True
