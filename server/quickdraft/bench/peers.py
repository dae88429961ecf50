"""Other implementations of the same idea, run on the same prompt ids for comparison.

- `hf-assisted`: transformers' `model.generate(..., assistant_model=draft)`, greedy.
- `hf-prompt-lookup`: transformers' `model.generate(..., prompt_lookup_num_tokens=N)`, greedy.
- `llama-cpp`, `llama-cpp-lookup`: llama-cpp-python on the GGUF files the models came from,
  plain and with `LlamaPromptLookupDecoding` (optional: needs the package and `.gguf` models).

Peers see exactly the prompt ids `Completer` builds, the same token budget and the same stop
tokens. Their output then goes through the same emission rule as the engine's (stop at a stop
token, at the token budget, or where the server's stop rule fires, one token at a time), so a
peer that overshoots inside one speculative step is not counted as different for it. Anything
else that differs from `ar` is reported as different.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.bench.llamacpp_peer_child import PROMPT_LOOKUP_TOKENS
from quickdraft.errors import QuickdraftError
from quickdraft.models import llamacpp_probe

PEERS: tuple[str, ...] = ("hf-assisted", "hf-prompt-lookup", "llama-cpp", "llama-cpp-lookup")

StopCheck = Callable[[list[int]], bool]


@dataclass
class PeerOutput:
    tokens: list[int]
    latency_ms: float
    prefill_ms: float | None
    """Time to the first new token (prefill, plus the first drafting round for assisted modes)."""
    decode_ms: float | None
    target_forwards: int | None
    """Target model forward calls, prefill included (each emits a token, as the engine's do)."""


def emit(
    tokens: Sequence[int], stop_ids: frozenset[int], max_new_tokens: int, stop: StopCheck | None
) -> list[int]:
    """The engine's emission rule applied to a finished token list."""
    out: list[int] = []
    for token in tokens:
        token = int(token)
        if token in stop_ids:
            break
        out.append(token)
        if len(out) >= max_new_tokens:
            break
        if stop is not None and stop(out):
            break
    return out


class Peer:
    name = ""

    def unavailable(self) -> str | None:
        """Why this peer cannot run here (None when it can)."""
        raise NotImplementedError

    def run(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        stop_ids: frozenset[int],
        stop: StopCheck | None,
    ) -> PeerOutput:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {}

    def note(self) -> str | None:
        """What the report should say of how the peer was set up (None: nothing)."""
        return None

    def close(self) -> None:
        """Release what the peer holds (a child process)."""


# --- transformers -----------------------------------------------------------------------------


class _FirstTokenClock:
    """A streamer that notes when the first new token arrives (the first `put` is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_token_at: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


class _ForwardCounter:
    def __init__(self, module) -> None:
        self.count = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


def _stopping_criteria(prompt_len: int, stop_ids, max_new_tokens: int, stop: StopCheck | None):
    """Ends `generate` once the emission rule would have stopped (the server's stop rule)."""
    import torch  # torch and transformers are heavy: only a transformers peer's run pays
    from transformers import StoppingCriteria, StoppingCriteriaList

    class RuleCriteria(StoppingCriteria):
        checked = 0
        """New tokens already seen not to stop (each prefix is checked once)."""

        def __call__(self, input_ids, scores, **kwargs):
            new = input_ids[0, prompt_len:].tolist()
            done = False
            for end in range(self.checked + 1, len(new) + 1):
                if new[end - 1] in stop_ids or end >= max_new_tokens or stop(new[:end]):
                    done = True
                    break
                self.checked = end
            return torch.full(
                (input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device
            )

    return StoppingCriteriaList([RuleCriteria()]) if stop is not None else None


class HFPeer(Peer):
    def __init__(self, name: str, target, draft=None, *, pad_token_id: int | None = None) -> None:
        self.name = name
        self.target = target
        self.draft = draft
        self.pad_token_id = pad_token_id
        self._assistant_config = getattr(draft, "generation_config", None)
        self._assistant_tokens = getattr(self._assistant_config, "num_assistant_tokens", None)

    def unavailable(self) -> str | None:
        if not hasattr(self.target, "generate"):
            return "the target model has no transformers `generate`"
        if self.name == "hf-assisted" and self.draft is None:
            return "no draft model is loaded"
        return None

    def describe(self) -> dict[str, Any]:
        if self.name == "hf-prompt-lookup":
            return {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
        # What transformers will use: the draft's generation config over its global defaults.
        config = self._assistant_config
        try:
            defaults = config._get_default_generation_params()  # private; best effort
        except Exception:
            defaults = {}
        values: dict[str, Any] = {}
        for key in (
            "num_assistant_tokens",
            "num_assistant_tokens_schedule",
            "assistant_confidence_threshold",
        ):
            own = getattr(config, key, None)
            values[key] = own if own is not None else defaults.get(key)
        return values

    def run(self, prompt_ids, max_new_tokens, stop_ids, stop) -> PeerOutput:
        import torch  # torch and transformers are heavy: only a transformers peer's run pays
        from transformers import GenerationConfig
        from transformers.utils import logging as transformers_logging

        device = next(self.target.parameters()).device
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        eos = sorted(stop_ids)
        pad = self.pad_token_id if self.pad_token_id is not None else (eos[0] if eos else 0)
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=eos or None,
            pad_token_id=pad,
        )
        kwargs: dict[str, Any] = {}
        if self.name == "hf-prompt-lookup":
            config.prompt_lookup_num_tokens = PROMPT_LOOKUP_TOKENS
        else:
            # HF's heuristic schedule carries the number of assistant tokens from one call to
            # the next; start every hole from the default, as every strategy starts cold.
            if self._assistant_config is not None:
                self._assistant_config.num_assistant_tokens = self._assistant_tokens
            kwargs["assistant_model"] = self.draft
        criteria = _stopping_criteria(len(prompt_ids), stop_ids, max_new_tokens, stop)
        if criteria is not None:
            kwargs["stopping_criteria"] = criteria
        clock = _FirstTokenClock()
        counter = _ForwardCounter(self.target)
        verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()  # its notes on argument styles, per call
        try:
            started = time.perf_counter()
            with torch.inference_mode():
                out = self.target.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    generation_config=config,
                    streamer=clock,
                    **kwargs,
                )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            finished = time.perf_counter()
        finally:
            counter.close()
            transformers_logging.set_verbosity(verbosity)
        raw = out[0, len(prompt_ids) :].tolist()
        tokens = emit(raw, stop_ids, max_new_tokens, stop)
        latency = (finished - started) * 1000
        prefill = (clock.first_token_at - started) * 1000 if clock.first_token_at else None
        return PeerOutput(
            tokens=tokens,
            latency_ms=latency,
            prefill_ms=prefill,
            decode_ms=latency - prefill if prefill is not None else None,
            target_forwards=counter.count,
        )


# --- llama.cpp --------------------------------------------------------------------------------


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


class PeerCrashed(RuntimeError):
    """The peer's process died or broke the protocol (the bench skips the peer, and goes on)."""


def probe_extra_bufts(gguf: Path, threads: int) -> tuple[bool, str]:
    """Whether llama.cpp's extra (AMX) buffers work here, as quickdraft's own runtime decides it
    (models.llamacpp_probe, cached per machine), and a sentence saying so for the report."""
    result = llamacpp_probe.probe(gguf, threads)
    if result.extra_bufts:
        return True, "with llama.cpp's extra buffers (the probe ran them)"
    return False, (
        "without llama.cpp's extra (AMX) buffers: they crashed in the probe on this machine,"
        " as quickdraft's own llama.cpp runtime found"
        if result.crashed_with_extra_bufts
        else "without llama.cpp's extra buffers (the probe's choice here)"
    )


class LlamaCppPeer(Peer):
    """llama-cpp-python on the `.gguf` file the target came from, in a child process
    (bench/llamacpp_peer_child.py): a crash there costs the peer, never the bench."""

    def __init__(
        self,
        name: str,
        gguf_path: str | Path | None,
        *,
        n_ctx: int = 4096,
        threads: int | None = None,
        extra_bufts: Callable[[Path, int], tuple[bool, str]] = probe_extra_bufts,
        child: Sequence[str] = (sys.executable, "-m", "quickdraft.bench.llamacpp_peer_child"),
        child_env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.gguf_path = Path(gguf_path) if gguf_path else None
        self.n_ctx = n_ctx
        self.threads = threads
        self._extra_bufts = extra_bufts
        self._child_command = list(child)
        self._child_env = child_env
        self._process: subprocess.Popen | None = None
        self.buffers: tuple[bool, str] | None = None
        """(extra buffers on, why), decided when the peer is first set up."""

    def unavailable(self) -> str | None:
        if not llama_cpp_available():
            return "llama-cpp-python is not installed (pip install 'quickdraft[llama]')"
        if self.gguf_path is None or self.gguf_path.suffix != ".gguf":
            return "the target was not loaded from a .gguf file"
        if not self.gguf_path.is_file():
            return f"{self.gguf_path} does not exist"
        if self.buffers is None:
            try:
                self.buffers = self._extra_bufts(self.gguf_path, self.threads or 1)
            except QuickdraftError as exc:
                return str(exc)
        return None

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"gguf": str(self.gguf_path), "process": "child"}
        if self.name == "llama-cpp-lookup":
            info["num_pred_tokens"] = PROMPT_LOOKUP_TOKENS
        if self.buffers is not None:
            info["extra_buffers"], info["buffers_note"] = self.buffers
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info["llama_cpp_python"] = importlib.metadata.version("llama-cpp-python")
        return info

    def note(self) -> str | None:
        """What the report says of how the peer was set up (None: nothing worth saying)."""
        if self.buffers is None or self.buffers[0]:
            return None
        return f"`{self.name}` ran {self.buffers[1]}"

    def _start(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        if self.buffers is None:
            reason = self.unavailable()
            if reason:
                raise PeerCrashed(reason)
        command = [*self._child_command, str(self.gguf_path), "--n-ctx", str(self.n_ctx)]
        if self.threads:
            command += ["--threads", str(self.threads)]
        if self.name == "llama-cpp-lookup":
            command.append("--lookup")
        if self.buffers is not None and not self.buffers[0]:
            command.append("--no-extra-bufts")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(self._child_env or {}))
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = self._receive()
        if not ready.get("ready"):
            self.close()
            raise PeerCrashed(f"llama.cpp did not load: {ready.get('error', ready)}")
        return self._process

    def _receive(self) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise PeerCrashed(self._death())
        try:
            return json.loads(line)
        except ValueError as exc:
            raise PeerCrashed(f"unreadable answer from the llama.cpp peer: {line!r}") from exc

    def _send(self, text: str) -> None:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(text + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise PeerCrashed(self._death()) from exc

    def _death(self) -> str:
        """Why the child is gone, with the last line it wrote to stderr."""
        assert self._process is not None
        try:
            code = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        tail = (self._process.stderr.read() if self._process.stderr else "").strip()
        last = tail.splitlines()[-1] if tail else ""
        self._process = None
        how = f"crashed (signal {-code})" if code < 0 else f"exited ({code})"
        return f"the llama.cpp peer's process {how}" + (f": {last}" if last else "")

    def close(self) -> None:
        if self._process is not None:
            with contextlib.suppress(OSError):
                self._process.kill()
            self._process.wait()
            self._process = None

    def run(self, prompt_ids, max_new_tokens, stop_ids, stop) -> PeerOutput:
        self._start()
        started = time.perf_counter()
        first_at = None
        raw: list[int] = []
        self._send(
            json.dumps({"prompt": [int(t) for t in prompt_ids], "max_new_tokens": max_new_tokens})
        )
        while True:
            message = self._receive()
            if message.get("done"):
                break
            if first_at is None:
                first_at = time.perf_counter()
            raw.append(int(message["token"]))
            if len(raw) >= max_new_tokens:
                continue  # the child stops by itself and says done
            finished = len(emit(raw, stop_ids, max_new_tokens, stop)) < len(raw)
            self._send("stop" if finished else "more")
        finished = time.perf_counter()
        latency = (finished - started) * 1000
        prefill = (first_at - started) * 1000 if first_at else None
        return PeerOutput(
            tokens=emit(raw, stop_ids, max_new_tokens, stop),
            latency_ms=latency,
            prefill_ms=prefill,
            decode_ms=latency - prefill if prefill is not None else None,
            target_forwards=None,
        )
