"""The generation loop: draft cheaply, verify with one target forward, keep what agrees.

    prompt ──prefill (reusing the cached prefix)──▶ target KV holds prompt[:-1], pending = prompt[-1]
    loop:
      propose   d1..dk        copy source, n-gram lookup, draft model, or nothing (k = 0 is plain
                              decoding)
      verify    target([pending, d1..dk]) -> logits (k+1, V)        one forward, k+1 positions
      accept    j drafts + 1 target token                          (verify.accept_greedy/sampling)
      crop      target KV to prompt + accepted drafts; the new token becomes `pending`
      (tree)    where a wide forward is nearly free, verify a tree instead: the chain plus the
                target's own runner-up tokens, one path accepted (decoding/tree.py)
      emit      token by token: stop tokens, max_new_tokens and the stop callback end it exactly
                where plain decoding would have ended

Greedy output is the target's own greedy output token for token, whatever was drafted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from quickdraft.config import DRAFT_MODEL_STRATEGIES, STRATEGIES, DecodingConfig
from quickdraft.decoding.confidence import TokenChoice, branch_points, token_choices
from quickdraft.decoding.copy import CopyAligner
from quickdraft.decoding.costmodel import (
    AcceptanceTracker,
    CostModel,
    LengthTracker,
    measure_step_costs,
)
from quickdraft.decoding.drafters import ModelDrafter, Proposal
from quickdraft.decoding.healing import TokenBytes, constrain
from quickdraft.decoding.llamacpp import LlamaCppRunner, LlamaCppWeights
from quickdraft.decoding.ngram import LIVE, LIVE_AFTER, NgramIndex, NgramMatch
from quickdraft.decoding.runner import (
    DEFAULT_SLOT_BYTES,
    PREFILL_CHUNK,
    ForwardCancelled,
    ModelRunner,
    Runner,
    StaticModelRunner,
    stopped,
    synchronize,
)
from quickdraft.decoding.tree import (
    BranchOdds,
    DraftTree,
    TokenRecycler,
    accept_tree,
    build_tree,
)
from quickdraft.decoding.verify import accept_greedy, accept_sampling, warp
from quickdraft.errors import ConfigError, InputError

SOURCES = ("ngram", "draft", "copy", "recycled", "ngram-branch")
"""Where drafts come from: prompt lookup, the draft model, a copy source (a next edit's region),
and a tree's other branches: the target's own runner-up tokens, other n-gram continuations."""
TREE_NGRAM_BRANCHES = 3
"""N-gram continuations besides the chain's that a tree may check (decoding/tree.py)."""
SCORED_KEPT = 8
"""`likelihoods` answers kept (a next edit's veto asks one or two per request)."""
PROMPT_FOLD = 16
"""An uncached prompt tail of at most this many tokens (a keystroke's) is computed by the first
decode forward (`Runner.folds_prompt`), exactly as a prefill would, rather than by a prefill
forward of its own: at a 1,400-token prompt of the 1.5B on 2 AMX cores a 1-token prefill took
128 ms and a step 86, and the two together 216. A longer tail is prefilled as before: a prefill
chunk runs whole whatever keystroke comes, so what it computes is kept, while the next
keystroke stops a decode forward and throws its rows away."""


@dataclass
class GenerationRequest:
    prompt_ids: Sequence[int]
    max_new_tokens: int = 64
    strategy: str = "hybrid"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    draft_length: int | None = None
    """Fixed number of drafted tokens per step; None lets the cost model choose each step."""
    language: str | None = None
    kind: str | None = None
    """What sort of completion this is ("line", "block"): with `language`, the key under which
    typical lengths are learned."""
    lookup_context: Sequence[int] | None = None
    """The tokens of the text before the cursor, as n-gram lookups should see it: the new tokens
    continue this text, not the end of the prompt (a FIM prompt places the suffix, or the suffix
    and markers, in between). None: the whole prompt."""
    after_cursor: Sequence[int] | None = None
    """The tokens of the text after the cursor (the FIM suffix section), an n-gram source."""
    required_prefix: bytes = b""
    """Token healing: the first new tokens must spell these bytes (decoding.healing)."""
    anchored_draft: Sequence[int] | None = None
    """Tokens expected right at the cursor (what followed the same text in an open file);
    n-gram strategies propose them first, as long as the output agrees with them."""
    copy_source: Sequence[int] | None = None
    """Tokens the output is expected to mostly copy (a next edit's region as it stands): the
    n-gram strategies propose long runs of them while the output agrees, and realign after it
    departs. None: no copy source."""
    max_copy_draft: int = 256
    """The most copy-source tokens one step drafts when the cost model chooses the length
    (`draft_length` None); completions' drafts are bounded by `max_draft_length` instead."""
    deadline: float | None = None
    """Absolute `time.monotonic()` after which generation stops and returns what is done."""
    cancel: threading.Event | None = None
    stop: Callable[[list[int]], bool] | None = None
    """Called with all new tokens after each one is emitted; True ends generation there."""
    slot: str | None = None
    """Whose KV caches to use (a document): each slot keeps its own, see runner.py."""
    abstain_below: float = 0.0
    """A floor on the answer's confidence (`confidence.confidence`: the product of its tokens'
    probabilities, which only falls as tokens are added): once the tokens written, through the
    last that spelled more than whitespace (`TokenBytes.blank`; a suggestion is scored without
    its trailing whitespace), are less likely than this, generation stops ("unsure"), since an
    answer through them would be held back anyway. 0: never. Forks (`alternatives`) ignore it."""


@dataclass
class GenerationStats:
    strategy: str = "ar"
    slot: str | None = None
    """The KV cache slot that served the request."""
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0
    """Prompt tokens the target's cache held already: the sum of the next two and
    `reused_own_tokens`."""
    reused_shared_tokens: int = 0
    """Of those, the ones adopted from another slot's cache (the prompt head documents share),
    by this request's prefill or by a warm-up of this slot since its last answer."""
    reused_warm_tokens: int = 0
    """Of those, the ones `Engine.warm` computed for this slot since its last answer."""
    new_tokens: int = 0
    target_forwards: int = 0
    """Decode-time target forwards (prefill excluded)."""
    produced_tokens: int = 0
    """Tokens those forwards produced (accepted drafts and the target's own token each time),
    a final stop token included: at least one per forward."""
    drafted_by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    accepted_by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    total_ms: float = 0.0

    @property
    def tokens_per_forward(self) -> float:
        """How many tokens one target forward produced on average (>= 1 when any ran)."""
        return self.produced_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def reused_own_tokens(self) -> int:
        """Reused tokens the document's own cache held from its earlier answers."""
        return self.reused_tokens - self.reused_shared_tokens - self.reused_warm_tokens

    def to_dict(self) -> dict:
        data = asdict(self)
        data["tokens_per_forward"] = round(self.tokens_per_forward, 3)
        data["reused_own_tokens"] = self.reused_own_tokens
        return data


@dataclass(frozen=True)
class Warmed:
    """What `Engine.warm` did to a slot's caches."""

    computed: int
    """Target tokens computed."""
    drafted: int
    """Draft model tokens computed."""
    adopted: int
    """Target tokens adopted from another slot's cache (a shared prompt head) instead."""


SHARED, WARM = "shared", "warm"
"""The kinds of credit a slot's cache holds for its next answer (`Engine._credits`)."""


@dataclass
class GenerationResult:
    tokens: list[int]
    stop_reason: str
    """"eos", "max_tokens", "stop", "unsure" (`abstain_below`), "deadline" or "cancelled"."""
    stats: GenerationStats
    choices: list[TokenChoice] = field(default_factory=list)
    """Per token of `tokens`, the target's log-probability of it and its runner-up
    (decoding.confidence): what scores the answer and where alternatives branch."""


def _length_key(request: GenerationRequest) -> str:
    return f"{request.language or ''}|{request.kind or ''}"


def _after(
    head: list[int], stop: Callable[[list[int]], bool] | None
) -> Callable[[list[int]], bool] | None:
    """A fork's stop callback: `stop` reads the whole answer, the fork's head included."""
    return None if stop is None else (lambda new: stop(head + new))


def make_runner(
    model: Any,
    static_cache_tokens: int | None = None,
    compile_steps: bool = False,
    slot_bytes: int = DEFAULT_SLOT_BYTES,
) -> Runner:
    """The runner for `model`: a torch runner for a torch module (on a preallocated static
    cache when `static_cache_tokens` is set), llama.cpp's for a model loaded in llama.cpp
    (`llamacpp.LlamaCppWeights`). `slot_bytes`: the memory the caches of documents not in use
    may keep."""
    if isinstance(model, torch.nn.Module):
        device = next(model.parameters()).device
        chunk = PREFILL_CHUNK if device.type == "cpu" else 512
        if static_cache_tokens is None:
            return ModelRunner(model, prefill_chunk=chunk, slot_bytes=slot_bytes)
        return StaticModelRunner(
            model, capacity=static_cache_tokens, compile_steps=compile_steps, prefill_chunk=chunk
        )
    if isinstance(model, LlamaCppWeights):
        return LlamaCppRunner(model, slot_bytes=slot_bytes)
    raise TypeError(f"no runner for a {type(model).__name__}: a torch module or a llama.cpp model")


class Engine:
    """A target model, an optional draft model, an n-gram index, and the loop that joins them.

    An engine belongs to one thread (the language server's model worker): one generation runs
    at a time, and nothing is locked.
    """

    def __init__(
        self,
        target: Any,
        draft: Any | None = None,
        *,
        stop_token_ids: Iterable[int] = (),
        config: DecodingConfig | None = None,
        cost_model: CostModel | None = None,
        static_cache_tokens: int | None = None,
        compile_steps: bool = False,
        token_bytes: TokenBytes | None = None,
        cache_bytes: int = 1 << 30,
    ) -> None:
        """`target`, `draft`: torch causal LMs, or GGUF models loaded in llama.cpp
        (`models.llamacpp.LlamaCppModel`, the `llamacpp.LlamaCppWeights` contract).

        `static_cache_tokens`: run torch models on preallocated KV caches of that many
        positions, with decode/verify steps compiled when `compile_steps` (accelerators);
        None keeps growing caches (CPU). `cache_bytes`: what the KV caches of documents not in
        use may keep (two thirds for the target's, one third for the draft's)."""
        self.config = config or DecodingConfig()
        share = {"target": cache_bytes * 2 // 3, "draft": cache_bytes // 3}

        def runner(model: Any, role: str) -> Runner:
            return make_runner(model, static_cache_tokens, compile_steps, share[role])

        self.target = runner(target, "target")
        self.drafter = (
            ModelDrafter(runner(draft, "draft"), self.target.vocab_size)
            if draft is not None
            else None
        )
        self.ngram = NgramIndex(self.config.ngram_min, self.config.ngram_max)
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.cost_model = cost_model or CostModel.estimate(has_draft=draft is not None)
        self.acceptance = AcceptanceTracker()
        self.lengths = LengthTracker()
        self.recycled = TokenRecycler()
        """The target's top tokens after each token it saw: a tree's branches."""
        self.branch_odds = BranchOdds(self.recycled.width)
        """How often a recycled candidate of each rank was right: where a tree grows."""
        self.token_bytes = token_bytes
        """What each token spells, for requests with a `required_prefix` (token healing)."""
        self._credits: dict[str | None, list[tuple[str, int, int]]] = {}
        """slot -> (SHARED or WARM, start, end): the positions of the target's cache of that
        slot adopted from another slot, or computed by a warm-up, since its last answer; the
        next answer on the slot takes those it reuses (`_credit`)."""
        self._scored: OrderedDict[tuple, list[list[float]]] = OrderedDict()
        """(model, prompt, continuations) -> `likelihoods`' answer, the latest SCORED_KEPT: the
        same question asked again (a next edit decided ahead, then asked for) is not computed
        twice."""

    @property
    def cost_model(self) -> CostModel:
        return self._cost_model

    @cost_model.setter
    def cost_model(self, costs: CostModel) -> None:
        """Adopt `costs`, with the prefill chunks their measured speeds allow a request on the
        growing caches of a CPU (costmodel.prefill_chunk_for; rows come out the same bits in any
        chunking). llama.cpp's runners and the static caches of accelerators keep theirs."""
        self._cost_model = costs
        target_chunk, draft_chunk = costs.prefill_chunks()
        draft = self.drafter.runner if self.drafter is not None else None
        for runner, chunk in ((self.target, target_chunk), (draft, draft_chunk)):
            if type(runner) is ModelRunner and runner.device.type == "cpu":
                runner.prefill_chunk = chunk

    def _runners(self) -> list[Runner]:
        """The target's runner, and the draft model's where there is one."""
        return [self.target] + ([self.drafter.runner] if self.drafter is not None else [])

    def close(self) -> None:
        """Free what the runners hold outside Python (llama.cpp contexts)."""
        for runner in self._runners():
            close = getattr(runner, "close", None)  # LlamaCppRunner; torch runners have none
            if callable(close):
                close()

    def reset_cache(self) -> None:
        """Drop every KV cache of both models (benchmarks use it to measure cold requests)."""
        self._credits.clear()
        self._scored.clear()
        self.target.reset_all()
        if self.drafter is not None:
            self.drafter.runner.reset_all()

    def forget_generated(self) -> None:
        """Forget the text this engine generated: the completions the n-gram drafter remembers
        and the target's runner-up tokens kept for trees (a benchmark's cold start; each would
        hand the next run of the same hole its answer)."""
        self.ngram.forget_completions()
        self.recycled.forget()

    def select_slot(self, slot: str | None) -> None:
        """Use `slot`'s KV caches (each document keeps its own)."""
        self.target.select(slot)
        if self.drafter is not None:
            self.drafter.runner.select(slot)

    def warm(
        self,
        prompt_ids: Sequence[int],
        *,
        slot: str | None = None,
        draft: bool = False,
        cancel: threading.Event | None = None,
    ) -> Warmed:
        """Extend `slot`'s caches toward a prompt a request will likely send (the idle warm-up):
        the target's, and the draft model's when `draft`. Stops between chunks (llama.cpp:
        inside a forward) when `cancel` is set. What it computed or adopted is credited to
        the slot's next answer (`GenerationStats.reused_warm_tokens`, `reused_shared_tokens`)."""
        self.select_slot(slot)
        prompt = [int(t) for t in prompt_ids]
        with self._short_prefill_chunks():
            reused, computed, _ = self.target.extend(prompt[:-1], cancel=cancel)
            adopted = self.target.last_adopted
            self._note_extend(slot, reused, adopted, computed)
            drafted = 0
            if draft and self.drafter is not None and not (cancel is not None and cancel.is_set()):
                _, drafted, _ = self.drafter.runner.extend(prompt[:-1], cancel=cancel)
        return Warmed(computed, drafted, adopted)

    @contextlib.contextmanager
    def _short_prefill_chunks(self) -> Iterator[None]:
        """Within it, the runners prefill in chunks of at most PREFILL_CHUNK: background work
        that any request may stop, and the request then waits for the chunk running (prefill
        chunks run whole), so it is kept short whatever the measured speed allows."""
        runners = self._runners()
        chunks = [runner.prefill_chunk for runner in runners]
        for runner, chunk in zip(runners, chunks, strict=True):
            runner.prefill_chunk = min(chunk, PREFILL_CHUNK)
        try:
            yield
        finally:
            for runner, chunk in zip(runners, chunks, strict=True):
                runner.prefill_chunk = chunk

    def _note_extend(
        self, slot: str | None, reused: int, adopted: int, computed: int | None = None
    ) -> None:
        """Update `slot`'s credits after a target `extend` that kept `reused` tokens, the last
        `adopted` of them from another slot, and (a warm-up) computed `computed` more: credits
        past the slot's own kept prefix are gone with it."""
        own = reused - adopted
        credits = [(kind, a, min(b, own)) for kind, a, b in self._credits.pop(slot, ()) if a < own]
        if adopted:
            credits.append((SHARED, own, reused))
        if computed:
            credits.append((WARM, reused, reused + computed))
        if credits:
            self._credits[slot] = credits
        held = getattr(self.target, "slots", None)  # credits of slots whose caches are gone
        if held is not None:
            for gone in set(self._credits) - set(held):
                del self._credits[gone]

    def _credit(self, slot: str | None, reused: int) -> dict[str, int]:
        """Take `slot`'s credits for an answer that reused `reused` tokens: {kind: tokens}."""
        taken = dict.fromkeys((SHARED, WARM), 0)
        for kind, a, b in self._credits.pop(slot, ()):
            taken[kind] += max(0, min(b, reused) - a)
        return taken

    def drafts_with_model(self, language: str | None, strategy: str) -> bool:
        """Whether the policy would draft with the draft model now (so warming its cache pays):
        a fixed-length strategy that uses it, or the cost model finding it worth a step."""
        if self.drafter is None or strategy not in DRAFT_MODEL_STRATEGIES:
            return False
        k, _ = self.cost_model.best_k(
            "draft", self.acceptance.rate(language, "draft"), self.config.max_draft_length
        )
        return k > 0

    # --- the loop ------------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> GenerationResult:
        self._check(request)
        self.select_slot(request.slot)
        with self.target.stopping_at(request.cancel):
            return self._generate(request)

    def _check(self, request: GenerationRequest) -> None:
        if len(request.prompt_ids) == 0:
            raise InputError("the prompt is empty")
        if request.max_new_tokens < 1:
            raise InputError(f"max new tokens must be at least 1, got {request.max_new_tokens}")
        if request.strategy not in STRATEGIES:
            raise ConfigError(
                f"unknown strategy {request.strategy!r} (known: {', '.join(STRATEGIES)})"
            )
        if request.strategy == "draft" and self.drafter is None:
            raise ConfigError("strategy 'draft' needs a draft model, and none is loaded")
        if request.required_prefix and self.token_bytes is None:
            raise ConfigError("a required prefix (token healing) needs the engine's token bytes")
        if request.temperature < 0:
            raise InputError(f"temperature must be >= 0, got {request.temperature}")
        if request.max_copy_draft < 1:
            raise InputError(f"max copy draft must be at least 1, got {request.max_copy_draft}")

    def _stopped(self, request: GenerationRequest) -> str | None:
        if not stopped(request.cancel, request.deadline):
            return None
        return "cancelled" if request.cancel is not None and request.cancel.is_set() else "deadline"

    def alternatives(
        self,
        request: GenerationRequest,
        answer: GenerationResult,
        count: int,
        *,
        within: int | None = None,
    ) -> list[GenerationResult]:
        """Up to `count` other answers to greedy `request`, forked off `answer`, the answer
        `generate` just gave it (the slot's cache still holding it): at the `count` positions
        of its first `within` tokens where the target was least sure (`branch_points`), the
        runner-up token, then greedy decoding on.

        No prompt token is computed again: each fork crops the cache back to the branch point,
        and the forks run from the last position to the first, so every fork finds its prefix
        still cached. An answer's head (before its branch) is the greedy answer's; its tail is
        what greedy decoding from there gives, up to the same budget and stop rule. Stops at
        `request`'s cancel or deadline; sampling requests have none."""
        self._check(request)
        if request.temperature > 0 or count < 1:
            return []
        self.select_slot(request.slot)
        prompt = [int(t) for t in request.prompt_ids]
        tokens, choices = answer.tokens[:within], answer.choices[:within]
        lookup = list(request.lookup_context if request.lookup_context is not None else prompt)
        found: list[GenerationResult] = []
        points = branch_points(choices, count, self.stop_token_ids)
        with self.target.stopping_at(request.cancel):
            for i in sorted(points, reverse=True):
                if self._stopped(request) is not None:
                    break
                start = len(prompt) + i  # the cache must hold prompt + tokens[:i]
                if self.target.tokens[:start] != prompt + tokens[:i]:
                    break  # another request used the slot meanwhile
                choice = choices[i]
                head = [*tokens[:i], choice.runner_up]
                branched = [
                    *choices[:i],
                    TokenChoice(choice.runner_up_logprob, tokens[i], choice.logprob),
                ]
                if request.stop is not None and request.stop(head):
                    found.append(GenerationResult(head, "stop", GenerationStats(), branched))
                    continue
                if len(head) >= request.max_new_tokens:
                    found.append(GenerationResult(head, "max_tokens", GenerationStats(), branched))
                    continue
                owed = request.required_prefix
                for token in head:
                    if owed:
                        owed = self.token_bytes.advance(owed, token)
                fork = dataclasses.replace(
                    request,
                    prompt_ids=prompt + head,
                    max_new_tokens=request.max_new_tokens - len(head),
                    lookup_context=lookup + head,
                    required_prefix=owed,
                    anchored_draft=None,
                    stop=_after(head, request.stop),
                )
                self.target.keep(start)
                tail = self._generate(fork, forked=True)
                found.append(
                    GenerationResult(
                        head + tail.tokens, tail.stop_reason, tail.stats, branched + tail.choices
                    )
                )
        return found

    def likelihoods(
        self,
        prompt_ids: Sequence[int],
        continuations: Sequence[Sequence[int]],
        *,
        slot: str | None,
        model: str = "target",
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> list[list[float]] | None:
        """The log-probability `model` ("target", or "draft": the draft model where one is
        loaded, else the target) gives each token of each continuation of `prompt_ids`
        (greedy or not: what it would give that token there), in `slot`'s cache. The prompt is
        computed once (reusing what the slot holds, or a longer prefix another slot holds);
        each continuation is one forward on top of it, cropped away after, so the slot then
        holds the prompt. A question asked before (among the latest SCORED_KEPT) is answered
        as it was, computing nothing. None when `cancel` or `deadline` stopped it first."""
        if not prompt_ids or any(not tokens for tokens in continuations):
            raise InputError("likelihoods need a prompt and continuations of a token or more")
        prompt = [int(t) for t in prompt_ids]
        key = (model, tuple(prompt), tuple(tuple(int(t) for t in c) for c in continuations))
        if key in self._scored:
            self._scored.move_to_end(key)
            return [list(scores) for scores in self._scored[key]]
        runner = self._scoring_runner(model, slot)
        scored: list[list[float]] = []
        with runner.stopping_at(cancel):
            try:
                first = runner.logits_after(prompt, cancel=cancel, deadline=deadline)
                for tokens in continuations:
                    if first is None or stopped(cancel, deadline):
                        return None
                    rows = first.reshape(1, -1).float()
                    if len(tokens) > 1:
                        rows = torch.cat([rows, runner.forward(tokens[:-1]).float()])
                    runner.keep(len(prompt))
                    picked = torch.log_softmax(rows, dim=-1)[torch.arange(len(tokens)), tokens]
                    scored.append(picked.tolist())
            except ForwardCancelled:
                return None
        self._scored[key] = scored
        while len(self._scored) > SCORED_KEPT:
            self._scored.popitem(last=False)
        return [list(scores) for scores in scored]

    def prefill(
        self,
        prompt_ids: Sequence[int],
        *,
        slot: str | None,
        model: str = "target",
        cancel: threading.Event | None = None,
    ) -> int:
        """Compute `model`'s cache of `prompt_ids` in `slot` ahead of `likelihoods` questions
        whose prompts start with them (there, another slot's longer shared prefix is adopted);
        the tokens computed. Stops when `cancel` is set, keeping what it computed."""
        if not prompt_ids:
            return 0
        runner = self._scoring_runner(model, slot)
        with runner.stopping_at(cancel):
            try:
                _, computed, _ = runner.extend([int(t) for t in prompt_ids], cancel=cancel)
            except ForwardCancelled:
                return 0
        return computed

    def _scoring_runner(self, model: str, slot: str | None) -> Runner:
        """The runner `model` names ("draft": the draft model's where one is loaded), on
        `slot`. Only its slot is selected: the other model would hold an empty sequence for a
        question it never computes, and push a document's cache out sooner (every other
        entry point selects both again)."""
        runner = self.drafter.runner if model == "draft" and self.drafter else self.target
        runner.select(slot)
        return runner

    def _generate(self, request: GenerationRequest, *, forked: bool = False) -> GenerationResult:
        """The loop. `forked`: an alternative (`alternatives`): the target's cache holds the
        prompt but its last token already, computed by decode steps; it is used as it is (no
        prefill), and the answer teaches nothing (n-gram memory, typical lengths)."""
        started = time.perf_counter()
        prompt = [int(t) for t in request.prompt_ids]
        stats = GenerationStats(
            strategy=request.strategy, slot=request.slot, prompt_tokens=len(prompt)
        )
        sampling = request.temperature > 0
        generator = torch.Generator()
        if sampling:
            generator.manual_seed(
                request.seed if request.seed is not None else random.getrandbits(63)
            )
        uses_ngram = request.strategy in ("ngram", "hybrid")
        tree_tokens = self._tree_tokens(request, sampling)

        # 1. Prefill. The target's cache must hold prompt[:-1]; the last prompt token is
        #    "pending" and goes into the first decode forward. Only the part after the longest
        #    prefix shared with the cache (the previous request) is computed.
        #    A short uncached tail is left to the first decode forward (`folded`, PROMPT_FOLD).
        folded: list[int] = []
        if forked:
            stats.reused_tokens = len(self.target.tokens)
        else:
            reused, computed, _ = self.target.extend(
                prompt[:-1],
                cancel=request.cancel,
                deadline=request.deadline,
                leave=PROMPT_FOLD if self.target.folds_prompt else 0,
            )
            if self.target.folds_prompt and not computed:
                folded = prompt[reused:-1] if len(prompt) - 1 - reused <= PROMPT_FOLD else []
            stats.reused_tokens, stats.prefill_tokens = reused, computed + len(folded)
            self._note_extend(request.slot, reused, self.target.last_adopted)
            credit = self._credit(request.slot, reused)
            stats.reused_shared_tokens, stats.reused_warm_tokens = credit[SHARED], credit[WARM]
        synchronize(self.target.device)
        decode_started = time.perf_counter()
        stats.prefill_ms = (decode_started - started) * 1000
        new: list[int] = []
        choices: list[TokenChoice] = []
        held = len(self.target.tokens) + len(folded)
        reason = self._stopped(request) if held < len(prompt) - 1 else None

        # N-gram lookups continue the text before the cursor (the new tokens follow it), and
        # the text after the cursor is a source of its own.
        lookup_context = list(
            request.lookup_context if request.lookup_context is not None else prompt
        )
        if uses_ngram:
            self.ngram.set_source(LIVE, lookup_context)
            self.ngram.set_source(LIVE_AFTER, list(request.after_cursor or ()))
        # A copy source (a next edit's region) is followed token by token: drafts come from
        # where the output stands in it.
        aligner = CopyAligner(request.copy_source) if uses_ngram and request.copy_source else None
        owed = request.required_prefix  # token healing: bytes the new tokens must spell first
        sequence = prompt
        # The answer's log-likelihood through its last token that wrote more than whitespace
        # (a suggestion is scored without its trailing whitespace, often cut anyway), that of
        # the whitespace since, and the likelihood under which it would be held back.
        likelihood = blank_since = 0.0
        floor = (
            math.log(request.abstain_below)
            if request.abstain_below > 0 and not forked
            else -math.inf
        )
        while reason is None:
            reason = self._stopped(request)
            if reason is not None:
                break
            # Drafts past the token budget could never be emitted: the last slot is the
            # target's own token.
            budget = request.max_new_tokens - len(new) - 1
            try:  # a draft model that is the target's own module stops with it
                proposal = self._propose(
                    sequence, lookup_context, new, request, budget, generator, owed, aligner
                )
            except ForwardCancelled:
                reason = "cancelled"
                break
            drafts = proposal.tokens if proposal is not None else []
            if proposal is not None and proposal.source == "draft":
                # The draft model stops at a cancel or the deadline; then so does the step.
                reason = self._stopped(request)
                if reason is not None:
                    break

            # 2. Verify: one target forward over [pending, d1..dk] -> logits (k+1, V); while
            #    healing, row i allows only tokens consistent with the bytes still owed after
            #    the first i drafts. Or over a tree holding that chain, where one pays.
            tree_size = self._tree_size(tree_tokens, owed, budget, proposal)
            tree = tree_path = None
            before = sequence[-2] if len(sequence) > 1 else None
            try:  # a cancel stops the forward part way (`Runner.stopping_at`)
                if tree_size:
                    tree = self._grow_tree(
                        before,
                        sequence[-1],
                        lookup_context if uses_ngram else None,
                        proposal,
                        request,
                        tree_size,
                        budget,
                    )
                    logits = self.target.forward_tree(tree.tokens, tree.parents, prompt=folded)
                else:
                    chain = [sequence[-1], *drafts]
                    logits = self.target.forward(chain, prompt=folded)
            except ForwardCancelled:
                reason = "cancelled"
                break
            folded = []
            if tree is not None:
                self.recycled.update(tree.tokens, tree.previous(before), logits)
            elif tree_tokens:  # later steps of this request may grow trees from them
                self.recycled.update(chain, [before, *chain[:-1]], logits)
            if owed:
                logits = constrain(logits, self.token_bytes, owed, drafts)
            stats.target_forwards += 1
            checked = len(drafts)  # the drafts this forward checked
            if tree is not None:
                emitted, tree_path = accept_tree(tree, logits)
                self.branch_odds.update(tree, tree_path)
                # The chain's nodes in the tree are its first drafts; those on the path, the
                # accepted ones.
                checked = accepted = 0
                for node in range(1, len(tree)):
                    source = tree.source_of(node)
                    if source is None:
                        checked += 1
                        accepted += node in tree_path
                    else:
                        stats.drafted_by_source[source] += 1
                        stats.accepted_by_source[source] += node in tree_path
            elif sampling:
                target_probs = warp(logits, request.temperature, request.top_p).cpu()
                draft_probs = proposal.probs if proposal is not None else None
                emitted, accepted = accept_sampling(drafts, draft_probs, target_probs, generator)
            else:
                emitted, accepted = accept_greedy(drafts, logits)
            rows = logits[[0, *tree_path]] if tree_path is not None else logits
            emitted_choices = token_choices(rows, emitted)

            # 3. Keep the keys/values of the accepted drafts, drop the rejected ones. The last
            #    emitted token is not in the cache yet: it is the next step's `pending`.
            if tree_path is not None:
                self.target.keep_tree_path(tree_path)
            else:
                self.target.keep(len(sequence) + accepted)
            if proposal is not None and checked:
                stats.drafted_by_source[proposal.source] += checked
                stats.accepted_by_source[proposal.source] += accepted
                copied = proposal.source == "copy" and aligner is not None
                tracker = aligner.acceptance if copied else self.acceptance
                tracker.update(
                    request.language, proposal.tracker_key or proposal.source, checked, accepted
                )

            # 4. Emit one token at a time so every stop lands exactly where plain decoding's would.
            stats.produced_tokens += len(emitted)
            appended = 0
            for token, choice in zip(emitted, emitted_choices, strict=True):
                if token in self.stop_token_ids:
                    reason = "eos"
                    break
                if owed:
                    owed = self.token_bytes.advance(owed, token)
                new.append(token)
                choices.append(choice)
                sequence.append(token)
                appended += 1
                if self.token_bytes is not None and self.token_bytes.blank(token):
                    blank_since += choice.logprob
                else:
                    likelihood, blank_since = likelihood + blank_since + choice.logprob, 0.0
                if len(new) >= request.max_new_tokens:
                    reason = "max_tokens"
                    break
                if request.stop is not None and request.stop(new):
                    reason = "stop"
                    break
                if likelihood < floor:
                    reason = "unsure"
                    break
            if uses_ngram and appended:
                lookup_context.extend(sequence[-appended:])
                self.ngram.extend_source(LIVE, sequence[-appended:])
                if aligner is not None:
                    aligner.advance(sequence[-appended:])

        if new and not forked:
            self.ngram.add_completion(new)
        if reason in ("eos", "stop", "max_tokens") and not forked:  # its length counts
            self.lengths.update(_length_key(request), len(new))
        synchronize(self.target.device)
        finished = time.perf_counter()
        stats.new_tokens = len(new)
        stats.decode_ms = (finished - decode_started) * 1000
        stats.total_ms = (finished - started) * 1000
        return GenerationResult(new, reason, stats, choices)

    # --- choosing the drafter, k and the tree ------------------------------------------------

    def _tree_tokens(self, request: GenerationRequest, sampling: bool) -> int:
        """Nodes this request's trees may hold, 0 where it stays chains: trees are greedy
        n-gram/hybrid steps on a runner that verifies them exactly, sized by `decoding.tree`
        or, for `auto`, by the cost model (`CostModel.tree_tokens`: at most a forward of
        TREE_MAX_STEPS steps; each step's tree is then cut where its nodes stop paying,
        `tree.worth_its_cost`). Where it is 0 no forward's runner-up tokens are kept either."""
        tree = self.config.tree
        if (
            request.strategy not in ("ngram", "hybrid")
            or sampling
            or tree == "off"
            or not self.target.supports_tree
        ):
            return 0
        return tree if isinstance(tree, int) else self.cost_model.tree_tokens()

    def _tree_size(
        self, tree_tokens: int, owed: bytes, budget: int, proposal: Proposal | None
    ) -> int:
        """Nodes of this step's tree (the pending token included), 0 for a chain: none while
        healing or at the last token, and a chain as long as the tree (a copy source's, or a
        long n-gram match) stays one."""
        if not tree_tokens or owed or budget < 1:
            return 0
        drafted = len(proposal.tokens) if proposal is not None else 0
        if proposal is not None and (proposal.source == "copy" or drafted >= tree_tokens - 1):
            return 0
        return tree_tokens

    def _grow_tree(
        self,
        before: int | None,
        pending: int,
        lookup_context: list[int] | None,
        proposal: Proposal | None,
        request: GenerationRequest,
        size: int,
        budget: int,
    ) -> DraftTree:
        """This step's tree from the `pending` token (after `before`): the proposal's chain,
        the other n-gram continuations of `lookup_context` (None: the strategy uses no
        n-grams), recycled candidates; with `decoding.tree: auto`, only as many nodes as the
        measured forward costs pay for."""
        drafts = proposal.tokens if proposal is not None else []
        chain_rate = 0.0
        if proposal is not None:
            chain_rate = self.acceptance.rate(
                request.language, proposal.tracker_key or proposal.source
            )
        branches: list[list[int]] = []
        if lookup_context is not None:
            matches = self.ngram.continuations(lookup_context, budget, TREE_NGRAM_BRANCHES + 1)
            others = [m.tokens for m in matches if not drafts or m.tokens[0] != drafts[0]]
            branches = others[:TREE_NGRAM_BRANCHES]
        return build_tree(
            before,
            pending,
            drafts,
            self.recycled,
            size,
            budget,
            self.branch_odds,
            chain_rate,
            branches,
            self.cost_model.target_step_ms if self.config.tree == "auto" else None,
        )

    def _propose(
        self,
        sequence: list[int],
        lookup_context: list[int],
        new: list[int],
        request: GenerationRequest,
        budget: int,
        generator: torch.Generator,
        owed: bytes = b"",
        aligner: CopyAligner | None = None,
    ) -> Proposal | None:
        """Pick this step's drafter and draft length; None means a plain decoding step.

        `sequence` is what the target and the draft model see; `lookup_context` is what the
        n-gram index matches on (the text before the cursor and the `new` tokens). `aligner`
        follows the output in the request's copy source, whose proposal comes first.
        """
        fixed_k = request.draft_length
        if request.strategy == "ar":
            return None
        if aligner is not None:
            copied = self._copy(aligner, request, budget)
            if copied is not None:
                return copied
        max_k = min(budget, fixed_k if fixed_k is not None else self.config.max_draft_length)
        if max_k <= 0:
            return None

        match = None
        anchored = request.anchored_draft
        if request.strategy in ("ngram", "hybrid"):
            if anchored is not None and list(anchored[: len(new)]) == new:
                rest = list(anchored[len(new) : len(new) + max_k])
                if rest:  # still on the copied text: it counts as a long match
                    match = NgramMatch(rest, self.config.ngram_max, "anchored")
            if match is None:
                match = self.ngram.lookup(lookup_context, max_k)
        use_draft_model = self.drafter is not None and request.strategy in DRAFT_MODEL_STRATEGIES
        # A short match is weaker evidence than a long one; it is tracked on its own and, in
        # hybrid with a fixed length, loses to the draft model.
        short = match is not None and match.match_length < self.config.hybrid_min_match
        ngram_key = "ngram:short" if short else "ngram"

        if fixed_k is not None:
            if match is not None and not (
                short and use_draft_model and request.strategy == "hybrid"
            ):
                return Proposal("ngram", match.tokens[:max_k], tracker_key=ngram_key)
            if use_draft_model and (request.strategy == "draft" or match is None or short):
                return self._draft(sequence, max_k, request, generator, owed)
            return None

        # Adaptive: the option with the highest expected tokens per millisecond, where plain
        # decoding (k = 0) is always an option.
        costs = self.cost_model
        best_rate = 1.0 / costs.target_step_ms(1)
        choice: tuple[str, int] | None = None
        if match is not None:
            rate_k, rate = costs.best_k(
                "ngram", self.acceptance.rate(request.language, ngram_key), len(match.tokens)
            )
            if rate_k > 0 and rate > best_rate:
                choice, best_rate = ("ngram", rate_k), rate
        if use_draft_model and (request.strategy == "draft" or match is None or short):
            assert self.drafter is not None
            rate_k, rate = costs.best_k(
                "draft",
                self.acceptance.rate(request.language, "draft"),
                max_k,
                catch_up=self.drafter.lag(sequence),
                remaining_tokens=self._remaining_tokens(request, len(new), budget + 1),
            )
            if rate_k > 0 and rate > best_rate:
                choice, best_rate = ("draft", rate_k), rate
        if choice is None:
            return None
        source, k = choice
        if source == "ngram":
            assert match is not None
            return Proposal("ngram", match.tokens[:k], tracker_key=ngram_key)
        return self._draft(sequence, k, request, generator, owed)

    def _copy(
        self, aligner: CopyAligner, request: GenerationRequest, budget: int
    ) -> Proposal | None:
        """The copy source's next tokens where the output stands in it: exactly `draft_length`
        of them when fixed, else the length the cost model finds fastest, up to
        `max_copy_draft` (far beyond completions' drafts: a rewrite copies whole lines). None
        when the output stands nowhere in the source, or plain decoding is expected faster."""
        fixed_k = request.draft_length
        tokens = aligner.propose(
            min(budget, fixed_k if fixed_k is not None else request.max_copy_draft)
        )
        if not tokens:
            return None
        if fixed_k is None:
            k, _ = self.cost_model.best_k(
                "copy", aligner.acceptance.rate(request.language, "copy"), len(tokens)
            )
            if k == 0:
                return None
            tokens = tokens[:k]
        return Proposal("copy", tokens)

    def _remaining_tokens(self, request: GenerationRequest, produced: int, budget: int) -> int:
        """How many more tokens this request will likely produce: the budget, or fewer when
        recent completions of its kind (of the kinds met, for one not met yet:
        `LengthTracker.expected`) have been shorter."""
        typical = self.lengths.expected(_length_key(request))
        if typical is None:
            return budget
        return max(1, min(budget, round(typical) - produced))

    def _draft(
        self,
        sequence: list[int],
        k: int,
        request: GenerationRequest,
        generator: torch.Generator,
        owed: bytes = b"",
    ) -> Proposal:
        assert self.drafter is not None
        return self.drafter.propose(
            sequence,
            k,
            temperature=request.temperature,
            top_p=request.top_p,
            generator=generator,
            min_confidence=self.config.draft_min_confidence,
            healing=(self.token_bytes, owed) if owed else None,
            cancel=request.cancel,
            deadline=request.deadline,
        )

    # --- calibration ---------------------------------------------------------------------

    def calibrate(
        self, context_tokens: int = 256, repeats: int = 2, budget_s: float = 15.0
    ) -> CostModel:
        """Measure this machine's step costs (costmodel.measure_step_costs) on the target's and
        the draft's runners, in a slot of their own, and adopt them for the adaptive policy."""
        self.select_slot("quickdraft:calibration")
        self.cost_model = measure_step_costs(
            self.target,
            self.drafter.runner if self.drafter is not None else None,
            vocab_size=self.target.vocab_size,
            device=self.target.device,
            context_tokens=context_tokens,
            repeats=repeats,
            budget_s=budget_s,
        )
        return self.cost_model
