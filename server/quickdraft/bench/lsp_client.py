"""A small LSP client over stdio that talks to a language server the way VS Code does.

`quickdraft bench --typing` drives the real `quickdraft serve` with it: JSON-RPC messages framed
with `Content-Length`, integer request ids counted from 1, `$/cancelRequest` for requests it no
longer wants, answers to the server's own requests (`workspace/configuration` gets the settings
tree, as the quickdraft extension answers it; `window/workDoneProgress/create` and
`client/registerCapability` get null). Every message sent and received is timestamped with
`time.perf_counter()`, so the bench measures what an editor would see.

It knows nothing of completion: it sends what it is given and hands back answers and
notifications.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quickdraft.errors import LanguageServerError

REQUEST_CANCELLED = -32800
"""The JSON-RPC error code of a request answered as cancelled."""
METHOD_NOT_FOUND = -32601
LOG_TAIL_LINES = 12


@dataclass
class Answer:
    """The server's response to one request."""

    result: Any = None
    error: dict[str, Any] | None = None
    received: float = 0.0
    """`time.perf_counter()` when it was read."""

    @property
    def cancelled(self) -> bool:
        return bool(self.error) and self.error.get("code") == REQUEST_CANCELLED


@dataclass
class Request:
    """A request sent to the server, and what became of it."""

    id: int
    method: str
    params: Any
    sent: float
    """`time.perf_counter()` when it was written."""
    future: asyncio.Future = field(repr=False)
    cancel_sent: float | None = None
    """When `$/cancelRequest` went out for it (None: never)."""

    @property
    def answered(self) -> bool:
        return self.future.done() and not self.future.cancelled() and not self.future.exception()

    @property
    def answer(self) -> Answer | None:
        return self.future.result() if self.answered else None


NotificationHandler = Callable[[str, Any, float], None]


class StdioLspClient:
    """One server process and the JSON-RPC conversation with it.

    `notifications(method, params, received)` is called for every notification the server
    sends. `settings` answers the server's `workspace/configuration` pulls (one copy per item).
    The server's stderr goes to `log_path`; its last lines come with every error about it.
    """

    def __init__(
        self,
        command: list[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        notifications: NotificationHandler | None = None,
        settings: Any = None,
    ) -> None:
        self.command = list(command)
        self.log_path = Path(log_path)
        self.env = env
        self.on_notification = notifications
        self.settings = settings
        self.process: asyncio.subprocess.Process | None = None
        self._pending: dict[int, Request] = {}
        self._next_id = 0
        self._reader: asyncio.Task | None = None
        self._exit_error: LanguageServerError | None = None
        self.server_requests: list[str] = []
        """Methods of the requests the server sent us, in order."""

    # --- the process --------------------------------------------------------------------

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *self.command,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    env=self.env,
                    limit=1 << 24,
                )
            except OSError as exc:
                raise LanguageServerError(
                    f"could not start the server ({self.command[0]}): {exc}"
                ) from None
        self._reader = asyncio.create_task(self._read_loop(), name="lsp-client-reader")

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    @property
    def exited(self) -> bool:
        return self._exit_error is not None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines the server wrote on stderr."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def describe_failure(self, what: str) -> str:
        tail = self.log_tail()
        where = f" (log: {self.log_path})"
        return f"{what}{where}" + (f"; its last log lines:\n{tail}" if tail else "")

    async def close(self, timeout: float = 15.0) -> int | None:
        """`shutdown`, then `exit`; kill the process if it does not end in time."""
        process = self.process
        if process is None:
            return None
        if not self.exited:
            try:
                request = self.request("shutdown", None)
                await self.wait(request, timeout, what="shutdown")
                self.notify("exit", None)
            except LanguageServerError:
                pass
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._reader.cancel()
        return process.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()

    # --- sending ------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> float:
        if self.exited:
            raise self._exit_error  # type: ignore[misc]
        assert self.process is not None and self.process.stdin is not None, "start() first"
        body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return time.perf_counter()

    def request(self, method: str, params: Any) -> Request:
        self._next_id += 1
        future = asyncio.get_running_loop().create_future()
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        request = Request(self._next_id, method, params, 0.0, future)
        self._pending[request.id] = request
        request.sent = self._send(message)
        return request

    def notify(self, method: str, params: Any) -> float:
        return self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def cancel(self, request: Request) -> None:
        """`$/cancelRequest` for a request not answered yet (once)."""
        if request.future.done() or request.cancel_sent is not None:
            return
        request.cancel_sent = self.notify("$/cancelRequest", {"id": request.id})

    async def wait(
        self,
        request: Request,
        timeout: float,
        *,
        what: str | None = None,
        heartbeat: Callable[[float], None] | None = None,
        every: float = 10.0,
    ) -> Answer:
        """The answer to `request`; LanguageServerError when the server exits or `timeout`
        seconds pass first. `heartbeat(seconds_waited)` is called every `every` seconds."""
        deadline = request.sent + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                label = what or f"{request.method} #{request.id}"
                raise LanguageServerError(
                    self.describe_failure(
                        f"the server did not answer {label} in {timeout:.0f} s (too slow or stuck)"
                    )
                )
            done, _ = await asyncio.wait({request.future}, timeout=min(left, every))
            if done:
                return request.future.result()
            if heartbeat is not None:
                heartbeat(time.perf_counter() - request.sent)

    def unanswered(self) -> list[Request]:
        return [r for r in self._pending.values() if not r.future.done()]

    # --- receiving ----------------------------------------------------------------------

    async def _read_loop(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        reason = "the server closed its output"
        try:
            while True:
                length = None
                while True:
                    line = await stdout.readline()
                    if not line:
                        raise EOFError
                    line = line.strip()
                    if not line:
                        break
                    name, _, value = line.decode("ascii", "replace").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length is None:
                    reason = "the server sent a message without Content-Length"
                    break
                body = await stdout.readexactly(length)
                self._dispatch(json.loads(body), time.perf_counter())
        except (EOFError, asyncio.IncompleteReadError):
            pass
        except (ValueError, UnicodeDecodeError) as exc:
            reason = f"the server sent an unreadable message ({exc})"
        status = None
        if self.process.returncode is None:
            try:
                status = await asyncio.wait_for(self.process.wait(), 5)
            except asyncio.TimeoutError:
                status = None
        else:
            status = self.process.returncode
        exited = f"exited with status {status}" if status is not None else "stopped answering"
        self._exit_error = LanguageServerError(
            self.describe_failure(f"the language server {exited}: {reason}")
        )
        for request in self._pending.values():
            if not request.future.done():
                request.future.set_exception(self._exit_error)
                request.future.exception()  # retrieved here: nobody may be waiting

    def _dispatch(self, message: dict[str, Any], received: float) -> None:
        method = message.get("method")
        if method is None:  # a response
            request = self._pending.get(message.get("id"))  # type: ignore[arg-type]
            if request is not None and not request.future.done():
                request.future.set_result(
                    Answer(message.get("result"), message.get("error"), received)
                )
            return
        if "id" in message:  # the server asks something of us
            self.server_requests.append(method)
            self._answer_server_request(message["id"], method, message.get("params"))
            return
        if self.on_notification is not None:
            self.on_notification(method, message.get("params"), received)

    def _answer_server_request(self, msg_id: Any, method: str, params: Any) -> None:
        response: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id}
        if method == "workspace/configuration":
            items = (params or {}).get("items") or [{}]
            response["result"] = [self.settings for _ in items]
        elif method in (
            "window/workDoneProgress/create",
            "client/registerCapability",
            "client/unregisterCapability",
            "window/showMessageRequest",
        ):
            response["result"] = None
        else:
            response["error"] = {"code": METHOD_NOT_FOUND, "message": f"unhandled: {method}"}
        if not self.exited:
            self._send(response)
