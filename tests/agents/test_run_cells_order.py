"""Several cells run scenario by scenario: one scenario's episodes under every attack and defense back to back (so
their shared prompt prefix is still in the model's KV snapshots), every cell's rows as running it alone gives,
each row saved when its episode ends, and a run killed part-way resumes with only the missing episodes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from rvu_pipelines.agents.evaluation import CellSpec, plan_cell, run_cell, run_cells


@dataclass(frozen=True)
class _Scenario:
    scenario_id: str
    benchmark: str = "canonical"


ATTACKS = ("native", "planted_call", "forged_turn")


def _runner(calls: list[tuple[str, str]], attack: str, fail_at: int | None = None):
    def episode(scenario, workdir):
        if fail_at is not None and len(calls) == fail_at:
            raise KeyboardInterrupt  # the process stopping mid-run
        calls.append((scenario.scenario_id, attack))
        succeeded = (int(scenario.scenario_id[1:]) + len(attack)) % 2 == 0
        return {"scenario_id": scenario.scenario_id, "attack_succeeded": succeeded, "utility": 1.0, "latency_s": 0.1}

    return episode


def _works(root: Path, calls: list[tuple[str, str]], samples: dict[str, list[_Scenario]], fail_at: int | None = None):
    return [
        plan_cell(
            CellSpec("canonical", "vanilla", "tiny", attack=attack),
            samples[attack],
            _runner(calls, attack, fail_at),
            model_id="m",
            settings_fingerprint="f",
            root=root,
            code_version="v1",
            attack_fingerprint=attack,
        )
        for attack in ATTACKS
    ]


def _samples() -> dict[str, list[_Scenario]]:
    every = [_Scenario(f"s{i}") for i in (2, 0, 1)]
    return {"native": every, "planted_call": every, "forged_turn": [_Scenario("s1"), _Scenario("s3")]}


def test_cells_run_scenario_by_scenario_with_the_rows_each_cell_gives_alone(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []
    runs = run_cells(_works(tmp_path / "together", calls, _samples()), llm=None, model_id="m", progress=False)
    assert calls == [
        ("s0", "native"),
        ("s0", "planted_call"),
        ("s1", "native"),
        ("s1", "planted_call"),
        ("s1", "forged_turn"),
        ("s2", "native"),
        ("s2", "planted_call"),
        ("s3", "forged_turn"),
    ]
    assert [run.spec.attack for run in runs] == list(ATTACKS)  # in the order planned, not the order run
    assert [run.new_episodes for run in runs] == [3, 3, 2]

    for run in runs:  # the same cell run alone, cell by cell
        alone = run_cell(
            run.spec,
            _samples()[run.spec.attack],
            _runner([], run.spec.attack),
            llm=None,
            model_id="m",
            settings_fingerprint="f",
            root=tmp_path / "alone",
            progress=False,
            code_version="v1",
            attack_fingerprint=run.spec.attack,
        )
        columns = ["scenario_id", "episode_key", "attack", "attack_succeeded", "utility", "code_version"]
        assert run.rows.select(columns).equals(alone.rows.select(columns))
        assert run.metrics["asr"] == alone.metrics["asr"] and run.metrics["n"] == alone.metrics["n"]


def test_a_run_killed_part_way_keeps_its_rows_and_resumes_with_the_rest(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []
    with pytest.raises(KeyboardInterrupt):
        run_cells(_works(tmp_path, calls, _samples(), fail_at=4), llm=None, model_id="m", progress=False)
    assert len(calls) == 4  # s0 under two attacks, s1 under two: each saved when it ended

    resumed: list[tuple[str, str]] = []
    works = _works(tmp_path, resumed, _samples())
    assert [len(work.todo) for work in works] == [1, 1, 2]
    runs = run_cells(works, llm=None, model_id="m", progress=False)
    assert resumed == [("s1", "forged_turn"), ("s2", "native"), ("s2", "planted_call"), ("s3", "forged_turn")]
    assert [run.reused_episodes for run in runs] == [2, 2, 0] and all(run.rows.height for run in runs)
    assert [run.rows.height for run in runs] == [3, 3, 2]


def test_cells_run_together_share_one_progress_bar_in_a_log(tmp_path: Path, capsys) -> None:
    """Stacked bars write cursor moves; where stderr is not a terminal (Dagster's log) the cells share one bar."""
    run_cells(_works(tmp_path, [], _samples()), llm=None, model_id="m", progress=True)
    err = capsys.readouterr().err
    assert "tiny/canonical: 3 cells" in err and "8/8" in err
    assert "\x1b[A" not in err


def test_the_real_agent_answers_the_same_in_either_order(smollm, tiny_models, tmp_path: Path) -> None:
    """Two BIPIA scenarios under two attacks on llama.cpp: scenario by scenario (the second attack's prompt starts
    from the first one's KV prefix) gives every row cell by cell gives, from empty response caches."""
    from rvu_pipelines.agents.harness import Harness
    from rvu_pipelines.redteam.table import heldout_sample

    scenarios = heldout_sample("bipia_email", 2)
    rows = {}
    for order in ("cells", "scenarios"):
        if smollm.prefix_store is not None:  # neither order starts from the other's KV snapshots
            smollm.prefix_store.clear()
        harness = Harness.open(
            smollm,
            profile="tiny",
            model_id=tiny_models["llm"].sha256,
            detector="heuristic",
            root=tmp_path / order / "attacks",
            cache_path=tmp_path / order / "llm_cache.sqlite",
            max_iters=1,
            max_tokens=8,
        )
        works = [
            harness.plan_cell("bipia_email", "vanilla", attack=attack, scenarios=scenarios)
            for attack in ("no_attack", "planted_call")
        ]
        if order == "cells":
            runs = [harness.run_cells([work], progress=False)[0] for work in works]
        else:
            runs = harness.run_cells(works, progress=False)
        assert all(run.llm_inferences > 0 and run.new_episodes == 2 for run in runs)
        columns = ["scenario_id", "episode_key", "attack_succeeded", "utility", "judge", "steps"]
        rows[order] = [run.rows.select(columns).to_dicts() for run in runs]
    assert rows["scenarios"] == rows["cells"]
