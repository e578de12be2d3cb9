"""The agent's weights de-quantised for the optimiser, and a one-scenario optimisation problem shared by the tests."""

import pytest


@pytest.fixture(scope="session")
def dequantized(tiny_models):
    """(model, tokenizer, sha256) of the tiny profile's GGUF in float32, gradients off for the weights."""
    from rvu_pipelines.models.dequantized import load_dequantized

    llm = tiny_models["llm"]
    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model, tokenizer, llm.sha256


@pytest.fixture(scope="session")
def capture_settings():
    from rvu_pipelines.agents.defenses import DefenseSettings
    from rvu_pipelines.detectors import HeuristicDetector

    return DefenseSettings(detector=HeuristicDetector())


@pytest.fixture(scope="session")
def train_scenario():
    """One InjecAgent dh scenario of the training split (never one of the canonical 10)."""
    from rvu_pipelines.attacks.optimised import training_scenarios
    from rvu_pipelines.scenarios import scenarios_for
    from rvu_pipelines.scenarios.registry import canonical_scenarios

    canonical = frozenset(s.scenario_id for s in canonical_scenarios())
    return training_scenarios(scenarios_for("injecagent_dh", None), 1, exclude=canonical)[0]


@pytest.fixture
def string_harness(smollm, tiny_models, tmp_path):
    """A harness of the real agent (llama.cpp, quantised GGUF, one short tool round) reading optimised strings from
    the given folder."""
    from rvu_pipelines.agents.harness import Harness

    def open_harness(strings_dir):
        return Harness.open(
            smollm,
            profile="tiny",
            model_id=tiny_models["llm"].sha256,
            detector="heuristic",
            root=tmp_path / "attacks",
            cache_path=tmp_path / "llm_cache.sqlite",
            max_iters=1,
            max_tokens=24,
            strings_dir=strings_dir,
        )

    return open_harness
