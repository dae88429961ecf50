"""A loopback HTTP proxy in front of the engine that misbehaves on demand (tests only).

Each request is answered by the next scripted `Act` for its path (in order), else passed to the
engine. Acts: an HTTP status with a body and headers, silence (a hung engine), a body that is
not an event stream, a stream that breaks off, or passing through. With an `ssl.SSLContext`
the proxy speaks TLS (a private certificate).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Act:
    kind: str
    """"status" | "hang" | "events" (a 200 event stream of `events`, then `end`) | "pass"."""
    status: int = 200
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    """Raw `data:` payloads for "events"."""
    content_type: str = "text/event-stream"
    close_early: bool = True
    """"events": end the connection after the events without the end marker."""


def status(code: int, message: str = "", headers: dict[str, str] | None = None) -> Act:
    body = json.dumps({"error": {"message": message, "code": code}}) if message else ""
    return Act("status", status=code, body=body, headers=dict(headers or {}))


def text_event(text: str, finish: str | None = None) -> str:
    return json.dumps({"choices": [{"text": text, "index": 0, "finish_reason": finish}]})


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


class EngineProxy:
    def __init__(self, upstream_port: int, *, tls: ssl.SSLContext | None = None) -> None:
        self.upstream_port = upstream_port
        self.tls = tls
        self.seen: list[Seen] = []
        self._script: dict[str, list[Act]] = defaultdict(list)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    def start(self, port: int = 0) -> EngineProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", port, ssl=self.tls), self._loop
        )
        self._server = future.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close():
            self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def script(self, path_end: str, *acts: Act) -> None:
        """Answer the next requests whose path ends with `path_end` with `acts`, in order."""
        with self._lock:
            self._script[path_end].extend(acts)

    def requests_to(self, path_end: str) -> list[Seen]:
        return [seen for seen in self.seen if seen.path.endswith(path_end)]

    def _next_act(self, path: str) -> Act:
        with self._lock:
            for path_end, acts in self._script.items():
                if path.endswith(path_end) and acts:
                    return acts.pop(0)
        return Act("pass")

    # --- the connection -------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ": " in line:
                    name, value = line.split(": ", 1)
                    headers[name.lower()] = value
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.seen.append(Seen(method, path, headers))
            act = self._next_act(path)
            if act.kind == "pass":
                await self._pass(lines, headers, body, writer)
            elif act.kind == "hang":
                await reader.read()  # until the client gives up and closes
            elif act.kind == "status":
                payload = act.body.encode()
                extra = "".join(f"{name}: {value}\r\n" for name, value in act.headers.items())
                writer.write(
                    f"HTTP/1.1 {act.status} Scripted\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n{extra}Connection: close\r\n\r\n".encode()
                    + payload
                )
            elif act.kind == "events":
                writer.write(
                    f"HTTP/1.1 200 OK\r\nContent-Type: {act.content_type}\r\n"
                    "Connection: close\r\n\r\n".encode()
                )
                for event in act.events:
                    writer.write(f"data: {event}\n\n".encode())
                if not act.close_early:
                    writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def _pass(self, lines, headers, body: bytes, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.upstream_port
        )
        kept = [
            f"{name}: {value}"
            for name, value in headers.items()
            if name not in ("connection", "keep-alive", "host")
        ]
        request = [lines[0], f"host: 127.0.0.1:{self.upstream_port}", *kept, "connection: close"]
        upstream_writer.write(("\r\n".join(request) + "\r\n\r\n").encode("latin-1") + body)
        await upstream_writer.drain()
        try:
            while chunk := await upstream_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        finally:
            upstream_writer.close()
