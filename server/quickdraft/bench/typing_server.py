"""One `quickdraft serve` subprocess for one typing-bench variant, started and initialized as
VS Code does (lsp_client.py speaks the protocol): the client capabilities VS Code announces, the
settings tree as `initializationOptions`, the notifications the server sends (stats per
request, status, errors), and one untimed request that waits for the models to load."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Protocol

from quickdraft.bench.editor import EditorDocument, inline_params
from quickdraft.bench.lsp_client import StdioLspClient
from quickdraft.errors import LanguageServerError

WARMUP_URI = "file:///quickdraft-bench/warmup.py"
WARMUP_TEXT = "def add(a, b):\n    return "

# VS Code's client capabilities, as far as the server can see them.
CLIENT_CAPABILITIES: dict[str, Any] = {
    "general": {"positionEncodings": ["utf-16"]},
    "textDocument": {
        "synchronization": {
            "dynamicRegistration": True,
            "willSave": True,
            "willSaveWaitUntil": True,
            "didSave": True,
        },
        "completion": {
            "dynamicRegistration": True,
            "contextSupport": True,
            "completionItem": {"snippetSupport": True, "labelDetailsSupport": True},
        },
        "inlineCompletion": {"dynamicRegistration": True},
    },
    "workspace": {
        "configuration": True,
        "didChangeConfiguration": {"dynamicRegistration": True},
        "workspaceFolders": True,
    },
    "window": {
        "workDoneProgress": True,
        "showMessage": {"messageActionItem": {"additionalPropertiesSupport": True}},
    },
}


class ServerBench(Protocol):
    """A bench that drives one `quickdraft serve` at a time and writes its results as it goes."""

    env: dict[str, Any]
    server: TypingServer | None

    def write(self, *, final: bool) -> dict[str, Any]: ...


def run_and_write_results(bench: ServerBench, main: Coroutine[Any, Any, None]) -> dict[str, Any]:
    """Run `main` (the bench's runs), then write the final results and return them. On Ctrl-C
    the server running is killed and what came so far is written, marked interrupted, before the
    KeyboardInterrupt goes on."""
    try:
        asyncio.run(main)
    except KeyboardInterrupt:
        bench.env["interrupted"] = True
        if bench.server is not None:
            bench.server.client.kill()
        bench.write(final=True)
        raise
    return bench.write(final=True)


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class TypingServer:
    """One `quickdraft serve` for one variant, started and initialized as VS Code does."""

    def __init__(
        self, command: list[str], settings: dict[str, Any], log_path: Path, say, *, root: Path
    ) -> None:
        self.settings = settings
        self.say = say
        self.root = root
        self.stats: dict[Any, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.status: dict[str, Any] | None = None
        self.models: dict[str, Any] | None = None
        self.client = StdioLspClient(
            command,
            log_path=log_path,
            env=server_env(),
            notifications=self._notified,
            settings=settings,
        )

    def _notified(self, method: str, params: Any, received: float) -> None:
        params = params if isinstance(params, dict) else {}
        if method == "$/quickdraft/stats":
            self.stats[params.get("requestId")] = params
        elif method == "window/logMessage":
            message = str(params.get("message", ""))
            if message.startswith(("models ready", "loading models")):
                self.say(f"  server: {message}")
        elif method == "window/showMessage":
            message = str(params.get("message", ""))
            if params.get("type") == 1:
                self.errors.append(message)
            self.say(f"  server says: {message}")
        elif method == "$/quickdraft/status":
            self.status = params
            if isinstance(params.get("models"), dict):
                self.models = params["models"]
            self.say(f"  server status: {params.get('state')}: {params.get('message', '')}")
            if params.get("state") == "error":
                self.errors.append(str(params.get("message") or "the server reported an error"))
        elif method == "$/progress":
            value = params.get("value") or {}
            text = " ".join(str(value.get(k)) for k in ("title", "message") if value.get(k))
            if text:
                self.say(f"  server progress: {text}")

    async def start(self, load_timeout: float) -> None:
        await self.client.start()
        root_uri = self.root.resolve().as_uri()
        initialize = self.client.request(
            "initialize",
            {
                "processId": os.getpid(),
                "clientInfo": {"name": "quickdraft bench --typing", "version": "1"},
                "rootUri": root_uri,
                "workspaceFolders": [{"uri": root_uri, "name": self.root.name}],
                "capabilities": CLIENT_CAPABILITIES,
                "initializationOptions": self.settings,
                "trace": "off",
            },
        )
        answer = await self.client.wait(initialize, load_timeout, what="initialize")
        if answer.error:
            raise LanguageServerError(f"initialize failed: {answer.error.get('message')}")
        self.client.notify("initialized", {})

    def fatal(self) -> str | None:
        """Why the server cannot serve completions, once it has said so."""
        for message in self.errors:
            if "could not load models" in message or "invalid configuration" in message:
                return message
        if self.status and self.status.get("state") == "error":
            return str(self.status.get("message") or "the server reported an error")
        return None

    async def warm_up(self, load_timeout: float) -> float:
        """One untimed request that waits for the models to load; returns the seconds it took."""
        doc = EditorDocument(WARMUP_URI, "python", WARMUP_TEXT)
        self.client.notify("textDocument/didOpen", doc.did_open())
        started = time.perf_counter()
        request = self.client.request(
            "textDocument/inlineCompletion", inline_params(doc, len(WARMUP_TEXT))
        )

        def heartbeat(waited: float) -> None:
            self.say(f"  still waiting for the models to load in the server ({waited:.0f} s)…")

        await self.client.wait(
            request, load_timeout, what="the first request (models loading)", heartbeat=heartbeat
        )
        self.client.notify("textDocument/didClose", {"textDocument": {"uri": doc.uri}})
        reason = self.fatal()
        if reason:
            raise LanguageServerError(
                f"the server cannot serve: {reason} (log: {self.client.log_path})"
            )
        return time.perf_counter() - started

    async def start_and_warm_up(self, load_timeout: float) -> float:
        """start(), then warm_up(); returns the seconds the warm-up took (to the millisecond)."""
        self.say("  loading models and warming up (the first request waits for them)…")
        await self.start(load_timeout)
        return round(await self.warm_up(load_timeout), 3)

    async def close(self) -> None:
        await self.client.close()

    async def close_and_note(self, facts: dict[str, Any]) -> None:
        """Close the server, noting in `facts` its log (unless one is noted), the errors the
        user was shown and its exit status."""
        facts.setdefault("log", str(self.client.log_path))
        facts["errors"] = list(self.errors)  # what the user was shown
        await self.close()
        facts["exit_status"] = self.client.returncode
