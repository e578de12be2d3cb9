"""Paired defense comparisons: exact McNemar on discordant pairs, Holm across the table."""

import math

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest

from rvu_pipelines.attacks.paired import holm, mcnemar_exact, paired_attack_tests, paired_defense_tests


def test_mcnemar_counts_only_discordant_pairs():
    first = [True] * 10 + [False] * 5 + [True] * 3
    second = [False] * 10 + [False] * 5 + [True] * 3
    a_only, b_only, p = mcnemar_exact(first, second)
    assert (a_only, b_only) == (10, 0)
    assert p == pytest.approx(2 * 0.5**10)  # two-sided exact binomial on 10 discordant pairs, all one way
    assert mcnemar_exact([True, False], [True, False]) == (0, 0, 1.0)


def test_mcnemar_refuses_unpaired_lengths():
    with pytest.raises(ValueError, match="equal lengths"):
        mcnemar_exact([True], [True, False])


def test_holm_matches_the_textbook_example():
    # p = 0.01, 0.04, 0.03, 0.005 -> sorted 0.005*4, 0.01*3, 0.03*2, 0.04*1 made monotone
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=20))
def test_holm_never_lowers_a_p_value_and_keeps_the_order(pvalues):
    adjusted = holm(pvalues)
    assert all(a >= p - 1e-12 and a <= 1.0 for a, p in zip(adjusted, pvalues, strict=True))
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    assert all(adjusted[i] <= adjusted[j] + 1e-12 for i, j in zip(order, order[1:], strict=False))


def _rows(defense: str, outcomes: list[bool], errors: set[int] = frozenset()) -> list[dict]:
    return [
        {
            "benchmark": "injecagent_dh",
            "attack": "gcg_universal",
            "defense": defense,
            "scenario_id": f"s{i}",
            "attack_succeeded": ok,
            "error": "boom" if i in errors else None,
        }
        for i, ok in enumerate(outcomes)
    ]


def test_defenses_are_compared_on_the_scenarios_both_scored():
    rows = pl.DataFrame(
        _rows("vanilla", [True] * 12 + [False] * 4, errors={0})
        + _rows("classifier", [False] * 16)
        + _rows("fath", [True] * 12 + [False] * 4)
    )
    table = paired_defense_tests(rows)
    assert table.height == 3  # three pairs in one (benchmark, attack) row
    pair = table.filter((pl.col("defense_a") == "classifier") & (pl.col("defense_b") == "vanilla")).row(0, named=True)
    assert pair["n_pairs"] == 15  # the errored vanilla episode is left out of the pair
    assert (pair["a_only"], pair["b_only"]) == (0, 11)
    assert pair["p"] == pytest.approx(binomtest(0, 11, 0.5).pvalue)
    # classifier-fath (0 vs 12) has the smallest p, so this pair is second in Holm's order: multiplied by 2
    assert pair["p_holm"] == pytest.approx(2 * pair["p"])
    assert pair["significant"]
    same = table.filter((pl.col("defense_a") == "fath") & (pl.col("defense_b") == "vanilla")).row(0, named=True)
    assert same["p"] == 1.0 and not same["significant"]
    assert not math.isnan(same["asr_a"])


def test_an_attack_is_compared_with_its_control_on_the_scenarios_both_ran_per_defense():
    def rows(attack: str, defense: str, outcomes: list[bool]) -> list[dict]:
        return [
            {
                "benchmark": "injecagent_dh",
                "attack": attack,
                "defense": defense,
                "scenario_id": f"s{i}",
                "attack_succeeded": ok,
                "error": None,
            }
            for i, ok in enumerate(outcomes)
        ]

    frame = pl.DataFrame(
        rows("gcg_per_scenario", "vanilla", [True] * 12)
        + rows("planted_call", "vanilla", [False] * 10 + [True] * 2 + [True] * 5)  # 5 scenarios the attack lacks
        + rows("gcg_per_scenario", "fath", [False] * 12)
        + rows("planted_call", "fath", [False] * 12)
        + rows("native", "fath", [False] * 12)  # no control named for native: not compared
    )
    tests = paired_attack_tests(frame, {"gcg_per_scenario": "planted_call", "forged_turn": "native"})
    assert tests.height == 2  # one per defense; forged_turn ran nowhere
    vanilla = tests.filter(pl.col("defense") == "vanilla").row(0, named=True)
    assert (vanilla["attack"], vanilla["control"], vanilla["n_pairs"]) == ("gcg_per_scenario", "planted_call", 12)
    assert (vanilla["a_only"], vanilla["b_only"]) == (10, 0)
    assert vanilla["p"] == pytest.approx(2 * 0.5**10) and vanilla["p_holm"] == pytest.approx(min(1.0, 2 * vanilla["p"]))
    fath = tests.filter(pl.col("defense") == "fath").row(0, named=True)
    assert fath["p"] == 1.0 and not fath["significant"] and vanilla["significant"]
