"""The best attack per scenario: any attack of the table landing counts, over the scenarios every attack scored."""

from __future__ import annotations

import polars as pl

from rvu_pipelines.redteam.table import best_of_attacks, study_markdown


def _rows(outcomes: dict[tuple[str, str], dict[str, bool | None]]) -> pl.DataFrame:
    """{(attack, defense): {scenario: succeeded, or None for an errored episode}} as episode rows."""
    return pl.DataFrame(
        [
            {
                "benchmark": "injecagent_dh",
                "attack": attack,
                "defense": defense,
                "scenario_id": scenario,
                "attack_succeeded": bool(ok),
                "error": "crashed" if ok is None else None,
            }
            for (attack, defense), by_scenario in outcomes.items()
            for scenario, ok in by_scenario.items()
        ]
    )


def test_a_scenario_counts_once_when_any_attack_lands_on_it() -> None:
    rows = _rows(
        {
            ("no_attack", "vanilla"): {"a": True, "b": True, "c": True, "d": True},  # a control, never counted
            ("planted_call", "vanilla"): {"a": True, "b": False, "c": False, "d": False},
            ("gcg_per_scenario", "vanilla"): {"a": True, "b": True, "c": False, "d": None},  # d errored: left out
            ("native", "vanilla"): {"a": False, "b": False, "c": True, "d": False},
            ("native", "rvg"): {"a": False, "b": False, "c": False, "d": False},  # one attack: no row
        }
    )
    [row] = best_of_attacks(rows)
    assert (row["defense"], row["attacks"], row["n"], row["successes"]) == ("vanilla", 3, 3, 3)
    assert (row["strongest"], row["strongest_successes"]) == ("gcg_per_scenario", 2)
    assert 0.4 < row["ci_low"] < 1.0 == row["ci_high"]
    text = study_markdown(pl.DataFrame(), pl.DataFrame(), [], best_of=[row])
    assert "| injecagent_dh | vanilla | 3 | 3 | 3/3 [" in text and "gcg_per_scenario (2/3)" in text


def test_retargeted_scenarios_and_empty_tables_are_left_out() -> None:
    rows = _rows(
        {
            ("native", "rvg"): {"u0/i7": False, "u1/i2": False},
            ("adaptive", "rvg"): {"u0/i0": True, "u1/i2": False},  # u0 retargeted to another goal
        }
    )
    [row] = best_of_attacks(rows)
    assert (row["n"], row["successes"], row["strongest"]) == (1, 0, "none landed")
    assert best_of_attacks(pl.DataFrame()) == []
