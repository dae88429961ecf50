"""Strategy names with a setup variant (`hybrid@llamacpp`, `hybrid@append`), read by the loop
(runner.py) and by the report alike.

A strategy on another variant of the setup than the first (`--runtime torch,llamacpp`,
`--layouts classic,append`) is compared with `ar` of its own variant for identity
(`ar@llamacpp`), and with the first variant's `ar` for speed and for the text it inserts
(`same_text_as_ar`).
"""

from __future__ import annotations

from quickdraft.config import STRATEGIES

VARIANT_MARK = "@"
"""Between a strategy and its variant: `hybrid@llamacpp`."""


def split_variant(name: str) -> tuple[str, str | None]:
    """ "hybrid@llamacpp" -> ("hybrid", "llamacpp"); "hybrid" -> ("hybrid", None)."""
    strategy, mark, variant = name.partition(VARIANT_MARK)
    return strategy, (variant if mark else None)


def baseline_of(name: str) -> str:
    """The `ar` run a strategy's tokens are compared with: the one of its own variant."""
    _, variant = split_variant(name)
    return "ar" if variant is None else f"ar{VARIANT_MARK}{variant}"


def with_variants(strategies: list[str], variants: list[str]) -> list[str]:
    """The strategy list extended with the engine strategies on each further variant."""
    extra = [
        f"{name}{VARIANT_MARK}{variant}"
        for variant in variants
        for name in strategies
        if name in STRATEGIES
    ]
    return [*strategies, *extra]
