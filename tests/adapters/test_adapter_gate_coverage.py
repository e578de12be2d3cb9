"""The gate's AUROC goal speaks for the whole evaluated zoo: a table that leaves an entry out never meets it, and the
report names what it left out."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rvu_pipelines.adapters.gate_coverage import (
    GATE_AUROC_GOAL,
    GATE_ZOO_GOAL,
    ZooCoverage,
    auroc_goal_verdict,
    record_coverage,
)

ZOO = tuple(f"adapter-{i:02d}" for i in range(44))


def test_the_whole_zoo_over_the_goal_meets_it() -> None:
    coverage = ZooCoverage.of(ZOO, reversed(ZOO))
    verdict = auroc_goal_verdict(0.93, coverage)
    assert coverage.complete and verdict.passed and verdict.reasons == ()
    assert coverage.sentence() == "Zoo coverage: all 44 evaluated zoo adapters scored."
    assert verdict.sentence().endswith(": met.")


def test_a_partial_zoo_over_the_floor_and_over_the_auroc_does_not_meet_it() -> None:
    left = ("adapter-07", "adapter-31", "adapter-40")
    coverage = ZooCoverage.of(ZOO, [a for a in ZOO if a not in left])
    verdict = auroc_goal_verdict(0.911, coverage)  # 41 scored, over the 40 floor, AUROC over 0.90: still not met
    assert len(coverage.scored) >= GATE_ZOO_GOAL and 0.911 >= GATE_AUROC_GOAL
    assert not verdict.passed and coverage.left_out == left
    assert "3 of the 44 evaluated zoo entries left out" in verdict.sentence()
    assert "41 of the 44" in coverage.sentence() and "adapter-07, adapter-31, adapter-40" in coverage.sentence()


def test_each_failing_part_gives_its_own_reason() -> None:
    small = ZooCoverage.of(ZOO[:30], ZOO[:30])
    reasons = auroc_goal_verdict(0.80, small).reasons
    assert reasons == ("AUROC 0.800 is under 0.90", "30 adapters scored, under 40")
    foreign = ZooCoverage.of(ZOO, [*ZOO, "elsewhere"])
    assert foreign.outside_config == ("elsewhere",) and not foreign.complete
    assert auroc_goal_verdict(0.95, foreign).reasons == ("1 scored adapters are not in the zoo config",)
    unmeasured = auroc_goal_verdict(float("nan"), ZooCoverage.of(ZOO, ZOO))
    assert not unmeasured.passed and "no trigger-free AUROC" in unmeasured.reasons[0]


@given(st.sets(st.sampled_from(ZOO)), st.floats(min_value=0.0, max_value=1.0))
def test_the_goal_is_met_exactly_when_every_part_holds(scored: set[str], auroc: float) -> None:
    coverage = ZooCoverage.of(ZOO, sorted(scored))
    verdict = auroc_goal_verdict(auroc, coverage)
    assert verdict.passed == (auroc >= GATE_AUROC_GOAL and len(scored) == len(ZOO))
    assert verdict.passed == (not verdict.reasons)


def test_the_report_carries_the_coverage_under_its_first_paragraph_once(tmp_path: Path) -> None:
    stamp = "Measured with `pytest`."
    (tmp_path / "gate.md").write_text(f"Gate over 2 benign + 1 harmful adapters:\n\n| table |\n\n{stamp}\n")
    coverage = ZooCoverage.of(("a", "b", "c"), ("a", "b"))
    verdict = auroc_goal_verdict(1.0, coverage)
    record_coverage(tmp_path, coverage, verdict)
    record_coverage(tmp_path, coverage, verdict)  # a second pass replaces the block, never stacks it
    lines = (tmp_path / "gate.md").read_text().splitlines()
    assert lines[0].startswith("Gate over") and lines[2].startswith("Zoo coverage: 2 of the 3")
    assert lines[3].startswith("Goal (") and "not met" in lines[3] and lines[5] == "| table |"
    assert sum(line.startswith("Zoo coverage") for line in lines) == 1 and lines[-1] == stamp
    stored = json.loads((tmp_path / "coverage.json").read_text())
    assert stored["left_out"] == ["c"] and stored["goal_met"] is False and stored["configured"] == 3
