"""Client settings over CLI defaults: layering, sections, and invalid settings kept out."""

from __future__ import annotations

import pytest

from quickdraft.config import load_config
from quickdraft.errors import ConfigError
from quickdraft.lsp.configuration import ConfigurationManager, section_of


def manager(**cli):
    return ConfigurationManager(load_config(cli or None))


def test_section_of():
    assert section_of(None, strict=False) is None
    assert section_of({}, strict=False) is None
    assert section_of({"quickdraft": {"a": 1}}, strict=False) == {"a": 1}
    assert section_of({"quickdraft": None}, strict=False) == {}
    # Neovim sends an empty Lua table as `[]`: no settings, not an invalid configuration.
    assert section_of([], strict=True) is None
    assert section_of({"quickdraft": []}, strict=False) == {}
    assert section_of({"decoding": {}}, strict=False) == {"decoding": {}}
    # another extension's settings are not ours, unless the payload is ours alone
    assert section_of({"python": {"x": 1}}, strict=False) is None
    assert section_of({"python": {"x": 1}}, strict=True) == {"python": {"x": 1}}
    with pytest.raises(ConfigError):
        section_of({"quickdraft": 3}, strict=False)
    with pytest.raises(ConfigError):
        section_of([1], strict=False)


def test_initialization_options_over_cli_defaults():
    m = manager(decoding={"max_new_tokens": 20, "temperature": 0.2})
    change = m.apply_initialization_options({"decoding": {"maxNewTokens": 30}})
    assert m.current.decoding.max_new_tokens == 30
    assert m.current.decoding.temperature == 0.2  # the CLI default survives
    assert change.changed and not change.models_changed


def test_settings_replace_each_other_but_keep_the_lower_layers():
    m = manager(decoding={"max_new_tokens": 20})
    m.apply_initialization_options({"quickdraft": {"decoding": {"temperature": 0.5}}})
    m.apply_settings({"quickdraft": {"languages": {"python": {"enabled": False}}}})
    assert not m.current.language("python").enabled
    assert m.current.decoding.temperature == 0.5
    m.apply_settings({"quickdraft": {"languages": {"rust": {"maxNewTokens": 7}}}})
    assert m.current.language("python").enabled  # the earlier settings were replaced
    assert m.current.max_new_tokens_for("rust") == 7
    assert m.current.max_new_tokens_for("go") == 20


def test_invalid_settings_keep_the_previous_configuration():
    m = manager()
    m.apply_settings({"quickdraft": {"decoding": {"maxNewTokens": 16}}})
    before = m.current
    with pytest.raises(ConfigError, match="decoding.maxNewTokens"):
        m.apply_settings({"quickdraft": {"decoding": {"maxNewTokens": 0}}})
    assert m.current is before
    with pytest.raises(ConfigError, match="languages.python.multiline"):
        m.apply_settings({"quickdraft": {"languages": {"python": {"multiline": "sometimes"}}}})
    assert m.current is before
    # and the layer was not replaced either: the next valid settings still lay over the init ones
    assert m.apply_settings({"unrelated": {}}) is None


def test_invalid_initialization_options_name_their_origin():
    m = manager()
    with pytest.raises(ConfigError, match="initializationOptions: context.nope"):
        m.apply_initialization_options({"context": {"nope": 1}})
    assert m.current == load_config(None)


def test_model_change_is_detected():
    m = manager(model={"target": "a", "draft": "b"})
    assert not m.apply_settings({"quickdraft": {"decoding": {"temperature": 0.1}}}).models_changed
    change = m.apply_settings({"quickdraft": {"model": {"target": "c"}}})
    assert change.models_changed
    m.revert_models(change.previous.model)
    assert m.current.model.target == "a"
