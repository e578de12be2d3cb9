"""A1-A7 (seed 002 Table 7): each blocked, memory unchanged, by the rule the paper names."""

from __future__ import annotations

import pytest

from rvu_pipelines.memory import ATTACK_VECTORS, ReferenceMonitor, Rule, TheoremChecker
from rvu_pipelines.memory.attacks import attack_world, run_attack

EXPECTED_DECIDERS = {"A1": {3}, "A2": {4}, "A3": {4}, "A4": {3, 4}, "A5": {9}, "A6": {4}, "A7": {5}}


@pytest.mark.parametrize("vector", ATTACK_VECTORS, ids=lambda v: v.id)
def test_attack_is_blocked_by_the_rule_the_seed_names(vector) -> None:  # noqa: ANN001
    items, setting = attack_world()
    monitor = ReferenceMonitor()
    monitor.install_many(items)
    checker = TheoremChecker(monitor)
    outcome = run_attack(vector.id, checker, setting)
    assert outcome.blocked, outcome.as_dict()
    assert outcome.state_unchanged and not outcome.leaked
    assert {int(r) for r in vector.seed_rules} <= set(outcome.rules_fired)
    assert set(outcome.deciding_rules) == EXPECTED_DECIDERS[vector.id]
    assert outcome.blocked_by_named_rule
    report = checker.finish()
    assert report.holds and report.untrusted_modifications == 0, report.violations


def test_a6_is_caught_only_through_transitive_taint() -> None:
    items, setting = attack_world()
    monitor = ReferenceMonitor()
    monitor.install_many(items)
    outcome = run_attack("A6", monitor, setting)
    (decision,) = outcome.decisions
    assert Rule.R8_TAINT_PROPAGATION in decision.rules and Rule.R5_UNTRUSTED not in decision.rules


def test_a7_laundered_write_has_no_tainted_dependency_left_and_still_fails() -> None:
    items, setting = attack_world()
    monitor = ReferenceMonitor()
    monitor.install_many(items)
    outcome = run_attack("A7", monitor, setting)
    (decision,) = outcome.decisions
    assert decision.rules == frozenset({Rule.R5_UNTRUSTED})
    assert "still tainted" in outcome.notes[0]
