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

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEERS: tuple[str, ...] = ("hf-assisted", "hf-prompt-lookup", "llama-cpp", "llama-cpp-lookup")
PROMPT_LOOKUP_TOKENS = 10
"""`prompt_lookup_num_tokens` and `num_pred_tokens`: the value both libraries document."""

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


class LlamaCppPeer(Peer):
    """llama-cpp-python on the `.gguf` file the target came from."""

    def __init__(self, name: str, gguf_path: str | Path | None, *, n_ctx: int = 4096, threads=None):
        self.name = name
        self.gguf_path = Path(gguf_path) if gguf_path else None
        self.n_ctx = n_ctx
        self.threads = threads
        self._llama = None

    def unavailable(self) -> str | None:
        if not llama_cpp_available():
            return "llama-cpp-python is not installed (pip install 'quickdraft[llama]')"
        if self.gguf_path is None or self.gguf_path.suffix != ".gguf":
            return "the target was not loaded from a .gguf file"
        if not self.gguf_path.is_file():
            return f"{self.gguf_path} does not exist"
        return None

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"gguf": str(self.gguf_path)}
        if self.name == "llama-cpp-lookup":
            info["num_pred_tokens"] = PROMPT_LOOKUP_TOKENS
        try:
            import llama_cpp  # optional (the `llama` extra)

            info["llama_cpp_python"] = getattr(llama_cpp, "__version__", None)
        except ImportError:
            pass
        return info

    def _load(self):
        if self._llama is None:
            import llama_cpp  # optional (the `llama` extra)

            kwargs: dict[str, Any] = dict(
                model_path=str(self.gguf_path), n_ctx=self.n_ctx, verbose=False, logits_all=True
            )
            if self.threads:
                kwargs["n_threads"] = self.threads
            if self.name == "llama-cpp-lookup":
                from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

                kwargs["draft_model"] = LlamaPromptLookupDecoding(
                    num_pred_tokens=PROMPT_LOOKUP_TOKENS
                )
            self._llama = llama_cpp.Llama(**kwargs)
        return self._llama

    def run(self, prompt_ids, max_new_tokens, stop_ids, stop) -> PeerOutput:
        llama = self._load()
        llama.reset()  # cold: no prefix reuse from the previous hole
        started = time.perf_counter()
        first_at = None
        raw: list[int] = []
        for token in llama.generate(list(prompt_ids), top_k=1, top_p=1.0, temp=0.0, reset=True):
            if first_at is None:
                first_at = time.perf_counter()
            raw.append(int(token))
            if (
                len(emit(raw, stop_ids, max_new_tokens, stop)) < len(raw)
                or len(raw) >= max_new_tokens
            ):
                break
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
