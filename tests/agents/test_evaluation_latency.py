"""Table 1's latency does not depend on which defense ran first: an episode whose LLM
answers come from the response cache is charged their original inference time, so two cells with the
same prompts report the same latency whichever of them paid for the inference."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rvu_pipelines.agents.evaluation import CellSpec, run_cell
from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
from rvu_pipelines.models import ChatCompletion

INFERENCE_S = 0.15


@dataclass(frozen=True)
class _Scenario:
    scenario_id: str
    benchmark: str = "canonical"


class _SlowModel:
    name = "slow"

    def chat(self, messages, *, max_tokens=128, temperature=0.0, seed=0, stop=None) -> ChatCompletion:
        time.sleep(INFERENCE_S)
        return ChatCompletion(messages[-1]["content"], "slow", 1, 1, INFERENCE_S, 0.0, "stop")


def _episode(llm):
    def run(scenario, workdir):  # an episode's own latency measurement, as run_episode takes it
        started = time.perf_counter()
        for step in range(2):  # two LLM calls whose prompts are the same under every defense
            llm.chat([{"role": "user", "content": f"{scenario.scenario_id} step {step}"}])
        return {
            "scenario_id": scenario.scenario_id,
            "attack_succeeded": False,
            "utility": 1.0,
            "latency_s": round(time.perf_counter() - started, 4),
            "error": None,
        }

    return run


def test_latency_of_a_cached_episode_is_its_original_inference_time(tmp_path: Path) -> None:
    with ResponseCache(tmp_path / "cache.sqlite") as cache:
        llm = CachedChatModel(_SlowModel(), cache, "sha-slow")
        scenarios = [_Scenario("s0"), _Scenario("s1")]
        kwargs = {"llm": llm, "model_id": "m", "settings_fingerprint": "f", "root": tmp_path, "progress": False}
        first = run_cell(CellSpec("canonical", "vanilla", "tiny"), scenarios, _episode(llm), **kwargs)
        second = run_cell(CellSpec("canonical", "rvg", "tiny"), scenarios, _episode(llm), **kwargs)
    assert first.llm_inferences == 4 and second.llm_inferences == 0 and second.llm_cache_hits == 4
    paid, replayed = first.rows, second.rows
    assert paid["llm_replayed_s"].to_list() == [0.0, 0.0]
    assert all(s >= 2 * INFERENCE_S for s in replayed["llm_replayed_s"].to_list())
    assert all(w < INFERENCE_S for w in replayed["wall_latency_s"].to_list())  # the lookups were fast
    for a, b in zip(paid["latency_s"].to_list(), replayed["latency_s"].to_list(), strict=True):
        assert b == pytest.approx(a, abs=0.05)  # same latency whichever defense computed the answers
    assert second.metrics["latency_s"] == pytest.approx(first.metrics["latency_s"], abs=0.05)
    assert second.cost()["llm_replayed_s"] >= 4 * INFERENCE_S
