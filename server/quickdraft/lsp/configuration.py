"""Client settings over the command-line defaults.

Three layers, each validated by `quickdraft.config.load_config` (nothing is re-validated here):

1. the `quickdraft serve` flags (the defaults),
2. `initializationOptions`,
3. the latest workspace settings (`workspace/didChangeConfiguration` or a
   `workspace/configuration` pull of section "quickdraft").

Each new set of workspace settings replaces the previous one (clients send the whole section).
A set that does not validate leaves the current configuration as it was and says why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from quickdraft.config import ModelConfig, QuickdraftConfig, load_config
from quickdraft.errors import ConfigError

SECTION = "quickdraft"
_TOP_LEVEL_KEYS = {"model", "decoding", "context", "cache", "languages"}


def section_of(payload: Any, *, strict: bool) -> dict[str, Any] | None:
    """The quickdraft settings inside `payload`, or None when it has none.

    Clients send either `{"quickdraft": {...}}` or the section itself. A payload with other
    keys only (another extension's settings) has none for us when not `strict`; when `strict`
    (initializationOptions, which are ours alone) it is taken as the section so that a typo
    is reported instead of ignored.
    """
    if payload is None or payload == []:
        # An empty Lua table travels as `[]` (Neovim encodes it so): no settings, not an error.
        return None
    if not isinstance(payload, dict):
        raise ConfigError(f"settings: expected an object, got {payload!r}")
    if SECTION in payload:
        inner = payload[SECTION]
        if inner is None or inner == []:
            return {}
        if not isinstance(inner, dict):
            raise ConfigError(f"{SECTION}: expected an object, got {inner!r}")
        return inner
    if not payload:
        return None
    if strict or any(key in _TOP_LEVEL_KEYS for key in payload):
        return payload
    return None


@dataclass
class ConfigChange:
    config: QuickdraftConfig
    previous: QuickdraftConfig

    @property
    def models_changed(self) -> bool:
        return self.config.model != self.previous.model

    @property
    def changed(self) -> bool:
        return self.config != self.previous


class ConfigurationManager:
    """Holds the layers and the current, valid configuration."""

    def __init__(self, defaults: QuickdraftConfig):
        self.defaults = defaults
        self._initial: dict[str, Any] = {}
        self._settings: dict[str, Any] = {}
        self.current = defaults

    def _build(self, initial: dict[str, Any], settings: dict[str, Any]) -> QuickdraftConfig:
        try:
            base = load_config(initial, self.defaults)
        except ConfigError as exc:
            raise ConfigError(f"initializationOptions: {exc}") from exc
        return load_config(settings, base)

    def apply_initialization_options(self, options: Any) -> ConfigChange:
        """Lay `initializationOptions` over the defaults. Raises ConfigError, keeping state."""
        initial = section_of(options, strict=True) or {}
        config = self._build(initial, self._settings)
        return self._commit(config, initial=initial)

    def apply_settings(self, payload: Any, *, strict: bool = False) -> ConfigChange | None:
        """Lay new workspace settings over defaults and initializationOptions.

        Returns None when `payload` holds no quickdraft settings. Raises ConfigError (the
        current configuration is kept).
        """
        settings = section_of(payload, strict=strict)
        if settings is None:
            return None
        config = self._build(self._initial, settings)
        return self._commit(config, settings=settings)

    def _commit(
        self,
        config: QuickdraftConfig,
        *,
        initial: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> ConfigChange:
        previous = self.current
        if initial is not None:
            self._initial = initial
        if settings is not None:
            self._settings = settings
        self.current = config
        return ConfigChange(config, previous)

    def revert_models(self, model_config: ModelConfig) -> None:
        """Keep the models that are running after a reload failed (the rest stays new)."""
        self.current = dataclasses.replace(self.current, model=model_config)
