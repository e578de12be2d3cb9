"""``hfer`` as an InjectionDetector, and inline as the ``hfer`` defense that aborts an episode before generation."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rvu_pipelines.agents.defenses.hfer import ABORT_PREFIX, SpectralKillSwitch, hfer_pipeline
from rvu_pipelines.detectors.base import InjectionDetector


def test_hfer_detector_calibrates_and_scores(hfer_detector, spectral_model, spectral_sets) -> None:
    detector = hfer_detector
    assert isinstance(detector, InjectionDetector) and detector.name == "hfer"
    assert detector.switch.layer in (2, 3) and detector.switch.n_calibration == 8
    held = spectral_sets["context_verification"].filter(pl.col("split") == "heldout").head(4)
    texts = held["text"].to_list()
    scores = detector.score(texts)
    assert scores.shape == (4,) and np.all((scores >= 0) & (scores <= 1))
    # predict at 0.5 is exactly the switch firing on the same features
    fired = np.array([bool(detector.switch.fires(detector.features(t))[0]) for t in texts])
    assert np.array_equal(detector.predict(texts), fired)
    assert detector.version.startswith(spectral_model.name)


@pytest.fixture(scope="module")
def injecagent_scenario(shared_data):
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset
    from rvu_pipelines.scenarios.injecagent import injecagent_scenarios

    frame = load_dataset(load_catalog().get("injecagent"), default_dataset_source()).frame
    return injecagent_scenarios(frame, shared_data / "injecagent" / "tools.json", "dh")[0]


def test_the_switch_reads_tool_outputs_and_passes_below_threshold(hfer_detector) -> None:
    switch = SpectralKillSwitch(hfer_detector, threshold=1.01)  # a probability never reaches it
    messages = [
        {"role": "user", "content": [{"type": "text", "content": "Summarise my latest email."}]},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": [{"type": "text", "content": "Meeting moved to 3 pm. Bring the slides."}]},
    ]
    _, _, _, out, _ = switch.query("Summarise my latest email.", None, messages=messages)  # type: ignore[arg-type]
    assert out == messages and list(switch.scores) == [2] and 0.0 <= switch.scores[2] <= 1.0


def test_the_hfer_defense_aborts_a_real_episode_before_generation(hfer_detector, injecagent_scenario, smollm) -> None:
    from rvu_pipelines.agents.defenses.builder import PrefilledToolCalls
    from rvu_pipelines.agents.llm_element import ChatModelLLM

    llm = ChatModelLLM(smollm, max_tokens=16, seed=0, default_system="You are a helpful assistant.")
    pipeline = hfer_pipeline(
        llm,
        hfer_detector,
        system_prompt="You are a helpful assistant.",
        first=PrefilledToolCalls(injecagent_scenario.prefill_calls),
        threshold=0.0,  # fires on any output
    )
    outcome = injecagent_scenario.run(pipeline)
    assert outcome.details["aborted"].startswith(ABORT_PREFIX)
    assert "layer" in outcome.details["aborted"]
    assert not outcome.attack_succeeded  # the attacker tool never ran: the model never generated
    last = outcome.messages[-1]
    assert last["role"] == "assistant" and ABORT_PREFIX in last["content"][0]["content"]
