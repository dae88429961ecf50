"""The draft model: a small LM of the same tokenizer proposing the next few tokens."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.decoding.healing import TokenBytes, constrain
from quickdraft.decoding.runner import Runner, common_prefix_length, stopped
from quickdraft.decoding.verify import warp


@dataclass
class Proposal:
    source: str
    """"ngram", "draft" or "copy"."""
    tokens: list[int]
    probs: torch.Tensor | None = None
    """(k, V) draft distributions when sampling from the draft model; None for greedy/n-gram."""
    tracker_key: str | None = None
    """The acceptance tracker's key when it is not `source` (e.g. "ngram:short")."""


class ModelDrafter:
    """Proposes tokens with its own KV cache, which follows the accepted sequence.

    Before proposing, the cache is cropped to the longest prefix it shares with the current
    sequence (rejected drafts fall away) and the missing accepted tokens are computed. Both the
    catch-up (in chunks) and the proposal forwards stop at a cancel or a deadline, checked
    between forwards, as the target's prefill does.
    """

    def __init__(self, runner: Runner, target_vocab_size: int) -> None:
        self.runner = runner
        self.target_vocab_size = target_vocab_size

    def reset(self) -> None:
        self.runner.reset()

    def lag(self, sequence: Sequence[int]) -> int:
        """Tokens of `sequence` the draft cache would have to compute before proposing."""
        return len(sequence) - common_prefix_length(self.runner.tokens, sequence)

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary: extra rows dropped, missing rows -inf."""
        v = self.target_vocab_size
        if logits.shape[-1] > v:
            return logits[..., :v]
        if logits.shape[-1] < v:
            pad = logits.new_full((*logits.shape[:-1], v - logits.shape[-1]), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        min_confidence: float = 0.0,
        healing: tuple[TokenBytes, bytes] | None = None,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> Proposal:
        """Up to k tokens continuing `sequence` (fewer if confidence drops below the floor, or
        when `cancel` or `deadline` stops it: none if they stop the catch-up).
        `healing`: (token bytes, bytes owed): propose only tokens the constraint allows."""
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        caught_up = self.runner.logits_after(sequence, cancel=cancel, deadline=deadline)
        if caught_up is None:
            return Proposal("draft", [])
        logits = self._to_target_vocab(caught_up)  # (V,)
        table, owed = healing if healing is not None else (None, b"")
        while len(tokens) < k:
            if owed:
                logits = constrain(logits[None], table, owed, ())[0]
            if temperature > 0:
                q = warp(logits[None], temperature, top_p)[0].cpu()
                token = int(torch.multinomial(q, 1, generator=generator))
                confidence = float(q[token])
                probs.append(q)
            else:
                token = int(logits.argmax())
                confidence = float(torch.softmax(logits, dim=-1)[token]) if min_confidence else 1.0
            if confidence < min_confidence:
                if probs:
                    probs.pop()
                break
            tokens.append(token)
            if owed:
                owed = table.advance(owed, token)
            if len(tokens) == k or stopped(cancel, deadline):
                break
            logits = self._to_target_vocab(self.runner.forward([token])[-1])
        stacked = torch.stack(probs) if (temperature > 0 and probs) else None
        return Proposal("draft", tokens, stacked)
