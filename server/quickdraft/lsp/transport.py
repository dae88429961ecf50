"""The client's bytes, read so that invalid UTF-8 never costs a message.

pygls parses a message body with a strict UTF-8 decode and drops a message it cannot read: a
dropped didChange would leave the server's copy of the document out of step with the
editor's. Here bad bytes in a body are replaced by U+FFFD instead, so the edit is applied (with
U+FFFD where the bad bytes were) and a request is answered. Both transports read through it:
stdio (`Utf8SafeInput`) and TCP (`serve_tcp`).
"""

from __future__ import annotations

import asyncio
import logging
import threading

log = logging.getLogger(__name__)


def repaired(body: bytes) -> bytes:
    """`body`, with any invalid UTF-8 replaced by U+FFFD (logged)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        log.warning("a message from the client is not valid UTF-8 (%s); bad bytes replaced", exc)
        return body.decode("utf-8", "replace").encode("utf-8")
    return body


class Utf8SafeInput:
    """The client's byte stream on stdio (pygls reads headers by line, bodies by length)."""

    def __init__(self, raw):
        self.raw = raw

    def readline(self) -> bytes:
        return self.raw.readline()

    def read(self, size: int) -> bytes:
        return repaired(self.raw.read(size))


class Utf8SafeStreamReader:
    """The same for a TCP connection's asyncio stream."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader

    async def readline(self) -> bytes:
        return await self.reader.readline()

    async def readexactly(self, size: int) -> bytes:
        return repaired(await self.reader.readexactly(size))


def serve_tcp(server, host: str, port: int) -> None:
    """pygls' `start_tcp` (one client connection at a time, the server shut down when it
    ends), reading the client through Utf8SafeStreamReader."""
    # pygls.io_ imports lsprotocol's types (half a second): only `serve --tcp` pays for it.
    from pygls.io_ import run_async

    server._stop_event = stop_event = threading.Event()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.protocol.set_writer(writer)
        await run_async(
            stop_event=stop_event,
            reader=Utf8SafeStreamReader(reader),
            protocol=server.protocol,
            logger=log,
            error_handler=server.report_server_error,
        )
        server.shutdown()

    async def listen() -> None:
        server._server = await asyncio.start_server(connection, host, port)
        log.info("listening on %s:%s", host, port)
        async with server._server:
            await server._server.serve_forever()

    try:
        asyncio.run(listen())
    except asyncio.CancelledError:
        log.debug("TCP server cancelled")
