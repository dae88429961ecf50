"""`context.max_prompt_tokens: auto`: the prompt budget follows this machine's measured prefill
speed (context/prompt.py's auto_prompt_tokens), fitted by the backend that knows the speed."""

from __future__ import annotations

import pytest

from quickdraft.backends import needs_step_costs
from quickdraft.config import FIXED_PROMPT_TOKENS, load_config
from quickdraft.context.prompt import (
    AUTO_PROMPT_BOUNDS,
    AUTO_PROMPT_SECONDS,
    AUTO_PROMPT_STEP,
    auto_prompt_tokens,
    fit_prompt_budget,
    prompt_tokens,
)
from quickdraft.decoding import CostModel
from quickdraft.errors import ConfigError
from quickdraft.generation import CompletionRequest
from quickdraft.testing import build_tiny_loaded_models, local_completer

LOW, HIGH = AUTO_PROMPT_BOUNDS


def test_auto_is_the_default_and_a_number_or_auto_is_accepted():
    assert load_config({}).context.max_prompt_tokens == "auto"
    assert load_config({"context": {"max_prompt_tokens": 900}}).context.max_prompt_tokens == 900
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        load_config({"context": {"max_prompt_tokens": "fast"}})
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        load_config({"context": {"max_prompt_tokens": 4}})


@pytest.mark.parametrize(
    ("tokens_per_s", "budget"),
    [
        (None, FIXED_PROMPT_TOKENS),
        (0.0, FIXED_PROMPT_TOKENS),
        (5.0, LOW),  # a very slow machine still gets the smallest measured-harmless budget
        ((LOW + 3 * AUTO_PROMPT_STEP + 50) / AUTO_PROMPT_SECONDS, LOW + 3 * AUTO_PROMPT_STEP),
        (10_000.0, HIGH),  # a fast one nothing above the largest measured
    ],
)
def test_the_budget_is_what_the_target_prefills_in_the_time_within_the_bounds(tokens_per_s, budget):
    assert auto_prompt_tokens(tokens_per_s) == budget
    assert auto_prompt_tokens(tokens_per_s) % AUTO_PROMPT_STEP == 0


def test_fitting_replaces_auto_only():
    auto = load_config({})
    fitted = fit_prompt_budget(auto, 10_000.0)
    assert fitted.context.max_prompt_tokens == HIGH
    assert auto.context.max_prompt_tokens == "auto"  # not changed in place
    fixed = load_config({"context": {"max_prompt_tokens": 700}})
    assert fit_prompt_budget(fixed, 10_000.0) is fixed
    # a reader that meets an unfitted auto uses the fixed budget
    assert prompt_tokens(auto.context) == FIXED_PROMPT_TOKENS


@pytest.fixture(scope="module")
def models():
    return build_tiny_loaded_models()


def measured(tokens_per_s: float) -> CostModel:
    return CostModel(
        target_ms={1: 100.0, 2: 150.0, 4: 250.0, 8: 600.0},
        draft_ms_per_token=30.0,
        prefill_tokens_per_s=tokens_per_s,
        measured=True,
    )


def test_the_local_backend_fits_auto_to_its_measured_speed_and_prompts_stay_within_it(models):
    completer = local_completer(models, load_config({"decoding": {"max_new_tokens": 4}}))
    # not measured (tests skip calibration): the fixed budget
    assert completer.config.context.max_prompt_tokens == FIXED_PROMPT_TOKENS
    slow = LOW / AUTO_PROMPT_SECONDS  # prefills the lower bound in the time
    completer.backend.engine.cost_model = measured(slow)
    completer.update_config(load_config({"decoding": {"max_new_tokens": 4}}))
    assert completer.config.context.max_prompt_tokens == LOW
    text = "".join(f"def f{i}(a, b):\n    return a + {i} * b\n\n" for i in range(400))
    text += "def g(a, b):\n    "
    lines = text.count("\n")
    prompt = completer.build_prompt(CompletionRequest("file:///w/x.py", text, lines, 4, "python"))
    assert completer.count_tokens(prompt.text) <= LOW
    # a number set by the user is not refitted
    completer.update_config(load_config({"context": {"max_prompt_tokens": 512}}))
    assert completer.config.context.max_prompt_tokens == 512


def test_step_costs_are_measured_when_the_budget_follows_them():
    assert needs_step_costs(load_config({}))  # hybrid drafts by them
    # plain decoding with an auto budget still needs the prefill speed
    assert needs_step_costs(load_config({"decoding": {"strategy": "ar"}}))
    assert not needs_step_costs(
        load_config({"decoding": {"strategy": "ar"}, "context": {"max_prompt_tokens": 1536}})
    )
