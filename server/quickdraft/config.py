"""The one configuration tree, validated at the edge.

Every setting quickdraft knows lives in a dataclass below. Values arrive as plain dicts (LSP
`initializationOptions`, `workspace/didChangeConfiguration`, CLI flags, bench options) and pass
through `load_config`, which checks names, types and ranges and says exactly which key is wrong.
The rest of the code trusts a `QuickdraftConfig` and checks no setting again (`quickdraft
complete` calls `load_config` before anything else). The decoding engine still guards its own
`GenerationRequest` (decoding/engine.py), a library call's arguments rather than the settings.

Keys may be written in snake_case (`max_new_tokens`) or camelCase (`maxNewTokens`), as editors
send them.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

from quickdraft.errors import ConfigError

Strategy = Literal["ar", "ngram", "draft", "hybrid"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
DRAFT_MODEL_STRATEGIES: tuple[str, ...] = ("draft", "hybrid")
"""The strategies that may ask the draft model (the cost model decides each step)."""
Runtime = Literal["auto", "torch", "llamacpp"]
RUNTIMES: tuple[str, ...] = get_args(Runtime)
FAMILIES: tuple[str, ...] = ("qwen2.5-coder", "deepseek-coder", "starcoder2", "codellama")
"""The FIM families `model.family` may name (each preset is of one; context/fim.py has each
one's template)."""


@dataclass
class ModelConfig:
    """Which models run, and where."""

    preset: str | None = None
    """A preset name (`quickdraft models list`); fills target and draft when those are unset."""
    target: str | None = None
    """Target model: preset name, Hub id, local directory or `.gguf` file."""
    draft: str | None = None
    """Draft model, same tokenizer as the target; None means n-gram drafting only."""
    device: str = "auto"
    """`auto` (CUDA if present, else CPU), `cpu`, `cuda`, `cuda:N`."""
    runtime: Runtime = "auto"
    """`llamacpp` runs the GGUF files themselves through llama.cpp (`pip install -e
    '.[llama]'`); `torch` runs transformers models. `auto`: llama.cpp on a CPU when it is
    installed and its estimated cost of a typical completion (from its measured forwards) is
    below torch's estimate (from one layer's timed linears), else torch (always with CUDA)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16", "int8"] = "auto"
    """torch runtime only. `auto` is bfloat16 on CUDA; on a CPU, the fastest of exact int8,
    bfloat16 and float32 as measured on this machine (`quickdraft models stepcost` shows it)."""
    draft_format: Literal["auto", "as-is"] = "auto"
    """The GGUF llama.cpp runs the draft from: `auto` makes a Q4_0 copy once and runs that where
    llama.cpp runs it faster on this CPU (models/draft_format.py; the draft only proposes and
    scores, so no completion changes); `as-is` runs the file as given."""
    threads: int | None = None
    """CPU threads for torch; None uses the physical cores."""
    calibrate: bool = True
    """Measure step costs at load (cached per machine) so the adaptive policy can use them."""
    compile: Literal["auto", "on", "off"] = "auto"
    """Static KV caches and torch.compile'd decode/verify steps (CUDA graphs on a GPU), as
    gpt-fast does. `auto`: on with CUDA, off on CPU (where quickdraft's int8 runs eagerly)."""
    static_cache_tokens: int = 4096
    """Positions preallocated per model when compiling; longer sequences grow the cache."""
    backend: Literal["local", "openai"] = "local"
    """`local` runs the models in this process; `openai` sends the FIM prompt to a serving
    engine's OpenAI-compatible `/v1/completions` (vLLM, llama.cpp's server, SGLang, TGI)."""
    url: str | None = None
    """The serving engine's base URL for `backend: openai`, e.g. `http://gpu-box:8000/v1`."""
    api_key_env: str | None = None
    """The name of the environment variable holding the engine's API key (never the key)."""
    remote_model: str | None = None
    """The model name the engine serves (its `model` field); None asks the engine."""
    family: str | None = None
    """FIM family (qwen2.5-coder, deepseek-coder, starcoder2, codellama) when no preset says it."""
    tokenizer: str | None = None
    """Tokenizer files (a directory or `.gguf`) to count prompt tokens for a remote engine;
    None takes the preset's."""
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 30.0


@dataclass
class DecodingConfig:
    """How tokens are produced."""

    strategy: Strategy = "hybrid"
    max_new_tokens: int = 64
    temperature: float = 0.0
    """0 is greedy; > 0 samples, and speculative sampling keeps the target's distribution."""
    top_p: float = 1.0
    seed: int | None = None
    draft_length: int | None = None
    """Tokens proposed per step; None lets the cost model choose each step."""
    max_draft_length: int = 12
    """Upper bound for the adaptive choice."""
    ngram_min: int = 2
    """Shortest suffix match the n-gram drafter accepts."""
    ngram_max: int = 8
    """Longest suffix tried first."""
    hybrid_min_match: int = 3
    """In `hybrid`, an n-gram match at least this long wins over the draft model."""
    draft_min_confidence: float = 0.0
    """The draft model stops proposing once its top probability falls below this (0: never)."""
    tree: int | Literal["auto", "off"] = "auto"
    """Verify a tree of proposals (the chain, plus the target's own runner-up tokens) in one
    forward instead of one chain (decoding/tree.py), greedy only, where the runner verifies
    trees exactly (torch's row-wise int8 attention). `auto`: the size the measured step costs
    pay for (a wide forward nearly free: AMX CPUs, GPUs), none elsewhere; a number: trees of
    that many tokens wherever the runner can."""
    deadline_ms: int | None = None
    """Stop generating after this many milliseconds and return what is done."""
    candidates: int = 3
    """Suggestions per place, the greedy one first: the others fork it where the model was
    least sure (decoding/confidence.py), computed after the first is shown, from its KV cache
    (no prompt token again). 1: the greedy suggestion only."""
    min_confidence: float = 0.3
    """Suggestions the model gives a lower probability than this (over the tokens shown) are
    not shown when the editor asks by itself; asked for (triggerKind Invoked), every one is.
    0.3 is the floor `quickdraft bench --candidates` chose on 84 held-out holes in four
    packages published after the model's training (Python and TypeScript): exact among shown
    37 % -> 71 %, 1 of the 31 exactly right ones hidden, half of the suggestions still shown
    (docs/performance.md, "Confidence floor"). 0 shows every one."""


FIXED_PROMPT_TOKENS = 1536
"""The budget of `context.max_prompt_tokens: auto` where this machine's prefill speed is not
measured (no step costs, a serving engine)."""


@dataclass
class ContextConfig:
    """What goes into the prompt."""

    max_prompt_tokens: int | Literal["auto"] = "auto"
    """Budget for the whole prompt: prefix, suffix and snippets of other files. `auto`: what
    this machine's target prefills in about 32 s by its measured step costs, within 1024-1536
    (1536 where the speed is not measured: no step costs, or a serving engine); the rule and
    its reasons are context/prompt.py's `auto_prompt_tokens`."""
    suffix_share: float = 0.25
    """Share of the file budget given to the text after the cursor."""
    snippet_share: float = 0.3
    """Share of the budget for snippets from other open documents (0 disables them)."""
    max_snippets: int = 4
    """`head: cursor`: at most this many windows of other files."""
    snippet_lines: int = 24
    """Lines per window of another file (`cursor`), or of each file's top (`workspace`)."""
    head: Literal["workspace", "cursor"] = "workspace"
    """What other files the prompt starts with. `workspace`: the top of every open file, in the
    order they were opened, the same for every document, so that head's KV cache is computed
    once and shared and a file you move to computes only its own part (context/workspace.py);
    `cursor`: the windows of other files most similar to the code above the cursor, chosen per
    document and spot."""
    max_document_bytes: int = 2_000_000
    """Documents larger than this are not used for completion (answered with an empty result)."""
    layout: Literal["pinned", "append", "classic"] = "pinned"
    """`append`: the text from an anchor line to the cursor goes after the FIM middle marker,
    so typing only appends to the prompt; `classic`: prefix, suffix, then the middle marker.
    `pinned`: as `append`, but the file's text starts with its top (its first lines, as many
    as the budget leaves), pinned there, and only a short window above the anchor, the suffix
    and the middle move with the cursor (`near_share`): opening a file or moving in it then
    computes only that window (context/prompt.py)."""
    near_share: float = 0.3
    """`pinned`: the share of the whole budget for the part of the prompt that moves with the
    cursor (the lines above the anchor, the suffix and the middle)."""
    anchor_lines: int = 16
    """`append`: the anchor moves once the cursor leaves this many lines below it."""


@dataclass
class CacheConfig:
    """Work kept and done ahead of the user: KV caches per document, warm-up, prefetch."""

    memory_mb: int = 1024
    """Budget for KV caches kept per document (target and draft together). The static cache
    of `model.compile: on` holds one document's and keeps no others: there it bounds nothing."""
    warmup: bool = True
    """Extend the caches toward the next request's prompt while the worker is idle; once the
    client asks for next edits, decide a changed document's next edit before it is asked for,
    and at a cursor resting away from the latest edit compute the next-edit veto's window
    head there."""
    prefetch: bool = True
    """After answering, compute the completion that follows accepting the suggestion."""


EditFormat = Literal["auto", "instruct", "zeta", "sweep", "instinct"]
EDIT_FORMATS: tuple[str, ...] = get_args(EditFormat)


@dataclass
class EditsConfig:
    """Next-edit suggestions (`textDocument/copilotInlineEdit`): the region the model rewrites
    around the cursor, the recent edits it is shown, and its budget."""

    enabled: bool = True
    lines_above: int = 8
    """Lines of the editable region above the cursor's line (snapped to statement boundaries)."""
    lines_below: int = 16
    """Lines of the editable region below the cursor's line."""
    history_hunks: int = 16
    """Recent edits kept per document (coalesced hunks; the oldest go first)."""
    history_bytes: int = 16384
    """...and at most this many bytes of them (old and new text) per document."""
    history_files: int = 3
    """Other files whose recent edits go into the prompt (the most recently edited first)."""
    format: EditFormat = "auto"
    """The prompt format: `instruct` (a chat prompt for instruction-tuned models such as the
    Qwen2.5-Coder Instruct models quickdraft ships), `zeta` (zed-industries/zeta), `sweep`
    (sweepai's next-edit models), `instinct` (Continue's Instinct). `auto`: the one the model's
    name says (zeta, sweep, instinct), else `instruct`."""
    max_new_tokens: int = 512
    """The most tokens one rewrite of the region may take (an answer cut there gives no edit)."""
    max_draft_length: int = 256
    """The longest run of the region proposed as one copy draft."""
    rules: bool = True
    """Propose edits derived from the latest edit itself (rename, import, signature, repeat;
    context/edit_rules.py), checked by the vetoes, before any model rewrite."""
    model_rewrite: Literal["auto", "on", "off"] = "auto"
    """The model rewriting the region when no rule proposes: `auto` only with a model trained
    for next edits (the zeta, sweep or instinct format), `on` always, `off` never."""
    likelihood_veto: Literal["draft", "target", "off"] = "draft"
    """Before a rule's edit is shown, a model scores the changed lines as they are and as the
    edit leaves them; one that makes them much less likely is not shown
    (context/edit_vetoes.py): `draft`, the draft model (the target where none is loaded),
    `target`, `off`. A serving engine (`backend: openai`) cannot score: not asked."""
    fill_arguments: bool = True
    """A parameter added without a default, where a call has no same-named variable to pass:
    the target writes the argument (a short fill-in-the-middle at the call, at most 16
    tokens), and the vetoes judge the call with it like any rule's edit. Off: such calls get
    no edit. A serving engine (`backend: openai`) is not asked."""


@dataclass
class LanguageConfig:
    """Per-language overrides. Unset fields fall back to the global values."""

    enabled: bool = True
    draft_length: int | None = None
    max_new_tokens: int | None = None
    multiline: Literal["auto", "always", "never"] = "auto"


@dataclass
class QuickdraftConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    edits: EditsConfig = field(default_factory=EditsConfig)
    languages: dict[str, LanguageConfig] = field(default_factory=dict)

    def language(self, language_id: str | None) -> LanguageConfig:
        """The settings for one language (defaults when it has none of its own)."""
        return self.languages.get(language_id or "", LanguageConfig())

    def max_new_tokens_for(self, language_id: str | None) -> int:
        own = self.language(language_id).max_new_tokens
        return own if own is not None else self.decoding.max_new_tokens

    def draft_length_for(self, language_id: str | None) -> int | None:
        own = self.language(language_id).draft_length
        return own if own is not None else self.decoding.draft_length


# --- validation ---------------------------------------------------------------------------

_RANGES: dict[str, tuple[float | None, float | None]] = {
    "max_new_tokens": (1, 4096),
    "temperature": (0.0, 10.0),
    "top_p": (1e-6, 1.0),
    "draft_length": (0, 64),
    "max_draft_length": (1, 64),
    "ngram_min": (1, 64),
    "ngram_max": (1, 64),
    "hybrid_min_match": (1, 64),
    "draft_min_confidence": (0.0, 1.0),
    "tree": (2, 64),
    "deadline_ms": (1, None),
    "candidates": (1, 8),
    "min_confidence": (0.0, 1.0),
    "threads": (1, 1024),
    "static_cache_tokens": (64, 1 << 20),
    "max_prompt_tokens": (16, 131072),
    "suffix_share": (0.0, 0.9),
    "near_share": (0.05, 1.0),
    "snippet_share": (0.0, 0.9),
    "max_snippets": (0, 64),
    "snippet_lines": (1, 1000),
    "max_document_bytes": (1, None),
    "anchor_lines": (1, 1000),
    "memory_mb": (0, 1 << 20),
    "connect_timeout_s": (0.1, 600.0),
    "read_timeout_s": (0.1, 3600.0),
    "lines_above": (0, 1000),
    "lines_below": (0, 1000),
    "history_hunks": (0, 1000),
    "history_bytes": (0, 1 << 24),
    "history_files": (0, 64),
    # A section's own range, where one name means different things in two sections.
    "edits.max_new_tokens": (1, 8192),
    "edits.max_draft_length": (1, 4096),
}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower().replace("-", "_")


def _check_scalar(path: str, name: str, value: Any, annotation: Any, section: str = "") -> Any:
    """Return `value` converted to `annotation`, or raise ConfigError naming `path`. The range
    checked is `section.name`'s when there is one, else `name`'s."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_scalar(path, name, value, option, section)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{path}: must not be null")
    if origin is Literal:
        allowed = get_args(annotation)
        if value not in allowed:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(map(str, allowed))}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
    elif annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        value = float(value)
        if value != value:  # NaN
            raise ConfigError(f"{path}: expected a number, got NaN")
    elif annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    else:  # pragma: no cover - only reached if a field of a new type is added without support
        raise ConfigError(f"{path}: unsupported setting type {annotation!r}")
    low, high = _RANGES.get(f"{section}.{name}", _RANGES.get(name, (None, None)))
    if low is not None and value < low:
        raise ConfigError(f"{path}: {value} is below the minimum {low}")
    if high is not None and value > high:
        raise ConfigError(f"{path}: {value} is above the maximum {high}")
    return value


def _merge_dataclass(path: str, current: Any, data: Any) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'configuration'}: expected an object, got {data!r}")
    hints = typing.get_type_hints(type(current))
    fields = {f.name: f for f in dataclasses.fields(current)}
    updates: dict[str, Any] = {}
    for raw_key, value in data.items():
        if not isinstance(raw_key, str):
            raise ConfigError(f"{path}: keys must be strings, got {raw_key!r}")
        key = _snake(raw_key)
        where = f"{path}.{raw_key}" if path else raw_key
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{where}: unknown setting (known: {known})")
        annotation = hints[key]
        sub = getattr(current, key)
        if dataclasses.is_dataclass(sub):
            updates[key] = _merge_dataclass(where, sub, value)
        elif get_origin(annotation) is dict:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: expected an object of languages, got {value!r}")
            merged = dict(sub)
            for lang, lang_data in value.items():
                base = merged.get(lang, LanguageConfig())
                merged[lang] = _merge_dataclass(f"{where}.{lang}", base, lang_data)
            updates[key] = merged
        else:
            updates[key] = _check_scalar(where, key, value, annotation, _snake(path))
    return dataclasses.replace(current, **updates)


def load_config(
    data: dict[str, Any] | None, base: QuickdraftConfig | None = None
) -> QuickdraftConfig:
    """Validate `data` and lay it over `base` (defaults when None).

    Raises ConfigError naming the first offending key; `base` is never modified, so a caller
    that catches the error keeps its previous, valid configuration.
    """
    config = _merge_dataclass("", base or QuickdraftConfig(), data or {})
    decoding = config.decoding
    if decoding.ngram_min > decoding.ngram_max:
        raise ConfigError(
            f"decoding.ngram_min ({decoding.ngram_min}) is larger than "
            f"decoding.ngram_max ({decoding.ngram_max})"
        )
    check_remote_backend(config.model)
    return config


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_remote_backend(model: ModelConfig) -> None:
    """`backend: openai` needs an http(s) URL without credentials, a variable *name* for the
    key, and a way to know the model family (a preset, or tokenizer files)."""
    if model.backend != "openai":
        return
    if not model.url:
        raise ConfigError(
            "model.url: backend openai needs the engine's address, e.g. http://gpu-box:8000/v1"
        )
    try:
        parts = urlsplit(model.url)
        host = parts.hostname
    except ValueError:
        parts, host = None, None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise ConfigError(f"model.url: {model.url!r} is not an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        # Never echo the URL here: it holds a secret.
        raise ConfigError(
            "model.url: credentials do not belong in the URL; put the API key in an "
            "environment variable and name it in model.api_key_env"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"model.url: {model.url!r}: no query or fragment, only the base URL")
    if model.api_key_env is not None and not _ENV_NAME.fullmatch(model.api_key_env):
        # Not echoed: a key pasted here by mistake must not reach a message or a log.
        raise ConfigError(
            "model.api_key_env: expected the name of an environment variable (letters, digits, "
            "underscores), never the key itself"
        )
    if model.family is not None and model.family not in FAMILIES:
        raise ConfigError(f"model.family: {model.family!r} is not one of {', '.join(FAMILIES)}")
    if model.preset is None and model.tokenizer is None:
        raise ConfigError(
            "model.backend openai: name the engine's model family: a preset (model.preset, "
            "e.g. qwen2.5-coder-7b) or tokenizer files (model.tokenizer) to count prompt tokens"
        )
