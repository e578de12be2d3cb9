"""The nightly sweep on the real tiny model: a defense broken on purpose fails the nightly check.

A healthy sweep of a small canonical sample becomes the golden file; then the classifier defense's
detector filter is made to crash. Re-materializing the cell in replay mode (stored rows of the same key are
replayed) still matches golden: replaying cannot catch a broken defense. The nightly sweep
(:func:`regression_sweep`: every episode re-run against the current code) sees every episode crash, and
both ``compare_to_golden`` and the ``matches_golden`` asset check fail on ``n`` and ``errors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rvu_pipelines.agents.evaluation import attack_table
from rvu_pipelines.agents.harness import Harness
from rvu_pipelines.agents.regression import (
    compare_to_golden,
    drift_markdown,
    golden_document,
    load_tolerance,
    regression_sweep,
)
from rvu_pipelines.code_version import code_version
from rvu_pipelines.scenarios.axes import CANONICAL
from rvu_pipelines.scenarios.contract import prefill_calls
from rvu_pipelines.scenarios.registry import load_benchmarks_config, scenario_by_id

DEFENSE = "classifier"
SAMPLE = 1  # the first canonical BIPIA scenario: its protocol pre-fills the read, so the filter always runs


@pytest.fixture(scope="module")
def harness(smollm, tiny_models, tmp_path_factory) -> Harness:
    root = tmp_path_factory.mktemp("nightly")
    return Harness.open(
        smollm,
        profile="tiny",
        model_id=tiny_models["llm"].sha256,
        detector="heuristic",
        root=root / "attacks",
        cache_path=root / "llm_cache.sqlite",
        max_iters=1,  # one tool round: the pre-filled read, the filter, one LLM answer
        max_tokens=16,
    )


def test_a_broken_defense_fails_the_nightly_check(harness, shared_data, monkeypatch, tmp_path: Path) -> None:
    from assets.attacks import _golden_check
    from rvu_pipelines.agents.defenses.elements import DetectorFilter

    ids = [e.scenario_id for e in load_benchmarks_config().canonical if e.scenario_id.startswith("bipia/")]
    scenarios = [scenario_by_id(i) for i in ids[:SAMPLE]]  # not all 10: AgentDojo's loader alone costs seconds
    assert len(scenarios) == SAMPLE and all(prefill_calls(s) for s in scenarios)
    tolerance = load_tolerance()

    healthy = regression_sweep(harness, (DEFENSE,), scenarios=scenarios, progress=False)
    table = attack_table(healthy)
    assert healthy[0].metrics["n"] == SAMPLE and healthy[0].metrics["errors"] == 0
    assert healthy[0].rows["code_version"].to_list() == [code_version()] * SAMPLE
    assert table["code_version"].to_list() == [code_version()]
    golden = golden_document(table, "tiny", harness.model_id)
    assert compare_to_golden(table, golden, tolerance) == []

    again = regression_sweep(harness, (DEFENSE,), scenarios=scenarios, progress=False)
    assert again[0].new_episodes == SAMPLE and again[0].reused_episodes == 0  # re-run, not replayed ...
    assert again[0].llm_inferences == 0 and again[0].llm_calls > 0  # ... and cheap: every prompt was cached
    assert compare_to_golden(attack_table(again), golden, tolerance) == []

    def broken(self, *args, **kwargs):
        raise RuntimeError("detector filter broken on purpose")

    monkeypatch.setattr(DetectorFilter, "query", broken)

    # replay mode: finished rows of the same key are reused, so the broken defense never runs
    replayed = harness.run_table(CANONICAL, (DEFENSE,), scenarios=scenarios, progress=False)
    assert replayed[0].new_episodes == 0
    assert compare_to_golden(attack_table(replayed), golden, tolerance) == []

    nightly = regression_sweep(harness, (DEFENSE,), scenarios=scenarios, progress=False)
    assert nightly[0].new_episodes == SAMPLE
    errors = nightly[0].rows["error"].to_list()
    assert errors == ["RuntimeError: detector filter broken on purpose"] * SAMPLE
    current = attack_table(nightly)
    drifts = compare_to_golden(current, golden, tolerance)
    assert [(d.cell, d.metric, d.golden, d.current) for d in drifts if d.metric in ("n", "errors")] == [
        (f"{CANONICAL}/native/{DEFENSE}", "n", SAMPLE, 0),
        (f"{CANONICAL}/native/{DEFENSE}", "errors", 0, SAMPLE),
    ]
    assert f"| {CANONICAL}/native/{DEFENSE} | errors | 0 | {SAMPLE} | +{SAMPLE} | +0 |" in drift_markdown(drifts)

    path = tmp_path / "table1_tiny.json"
    path.write_text(json.dumps(golden))
    check = _golden_check(current, "tiny", path)  # the nightly job's asset check, on the same table
    assert check.passed is False and check.metadata["code_version"].value == code_version()
    assert _golden_check(table, "tiny", path).passed is True
