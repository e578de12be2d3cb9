"""Paired comparisons: two defenses under one attack, or an attack against its control under one defense, on
the same scenarios, exact McNemar, Holm over each family.

Every defense of a (benchmark, attack) row runs on the same scenarios, so two defenses are compared on the
scenarios both scored (errored episodes left out): only the discordant pairs (one defense stopped the attack, the
other did not) carry information, and under the null hypothesis each way is equally likely, so the exact test is
a binomial test on them. A table compares many pairs; Holm's step-down correction keeps the family-wise error at
``alpha`` over all of them. An attack is compared with its control the same way (does the optimised string beat
the unoptimised text it started from, on the scenarios both ran?), as a family of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import polars as pl


def mcnemar_exact(first: Sequence[bool], second: Sequence[bool]) -> tuple[int, int, float]:
    """(first only, second only, two-sided exact p) for paired outcomes of equal length."""
    if len(first) != len(second):
        raise ValueError(f"paired outcomes need equal lengths, got {len(first)} and {len(second)}")
    only_first = sum(1 for a, b in zip(first, second, strict=True) if a and not b)
    only_second = sum(1 for a, b in zip(first, second, strict=True) if b and not a)
    discordant = only_first + only_second
    if discordant == 0:
        return only_first, only_second, 1.0
    from scipy.stats import binomtest

    return only_first, only_second, float(binomtest(only_first, discordant, 0.5).pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (monotone, capped at 1), in the input's order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [1.0] * len(pvalues)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


def paired_defense_tests(rows: pl.DataFrame, alpha: float = 0.05) -> pl.DataFrame:
    """Every pair of defenses within each (benchmark, attack), on the scenarios both scored.

    ``rows``: episode rows with benchmark, attack, defense, scenario_id, attack_succeeded and error. Columns out:
    benchmark, attack, defense_a, defense_b, n_pairs, asr_a, asr_b, a_only, b_only, p, p_holm, significant."""
    scored = rows.filter(pl.col("error").is_null()) if "error" in rows.columns else rows
    results: list[dict[str, object]] = []
    for (benchmark, attack), group in sorted(
        scored.group_by(["benchmark", "attack"]), key=lambda item: tuple(map(str, item[0]))
    ):
        outcomes = _outcomes_by(group, "defense")
        for first, second in combinations(sorted(outcomes), 2):
            pair = _paired(outcomes[first], outcomes[second])
            results.append({"benchmark": benchmark, "attack": attack, "defense_a": first, "defense_b": second, **pair})
    keys = {"benchmark": pl.String, "attack": pl.String, "defense_a": pl.String, "defense_b": pl.String}
    return _with_holm(results, keys, alpha)


def paired_attack_tests(rows: pl.DataFrame, controls: Mapping[str, str], alpha: float = 0.05) -> pl.DataFrame:
    """Each attack against its control (``controls``: attack -> control attack) within each (benchmark, defense),
    on the scenarios both ran; "a" is the attack, "b" its control. Columns out: benchmark, defense, attack,
    control, n_pairs, asr_a, asr_b, a_only, b_only, p, p_holm, significant."""
    scored = rows.filter(pl.col("error").is_null()) if "error" in rows.columns else rows
    results: list[dict[str, object]] = []
    for (benchmark, defense), group in sorted(
        scored.group_by(["benchmark", "defense"]), key=lambda item: tuple(map(str, item[0]))
    ):
        outcomes = _outcomes_by(group, "attack")
        for attack, control in sorted(controls.items()):
            if attack in outcomes and control in outcomes:
                pair = _paired(outcomes[attack], outcomes[control])
                results.append(
                    {"benchmark": benchmark, "defense": defense, "attack": attack, "control": control, **pair}
                )
    keys = {"benchmark": pl.String, "defense": pl.String, "attack": pl.String, "control": pl.String}
    return _with_holm(results, keys, alpha)


def _outcomes_by(group: pl.DataFrame, column: str) -> dict[str, dict[str, bool]]:
    """scenario id -> attack succeeded, per value of ``column``."""
    return {
        str(value): dict(zip(part["scenario_id"].to_list(), part["attack_succeeded"].to_list(), strict=True))
        for (value,), part in group.group_by([column])
    }


def _paired(first: Mapping[str, bool], second: Mapping[str, bool]) -> dict[str, object]:
    shared = sorted(set(first) & set(second))
    a = [bool(first[s]) for s in shared]
    b = [bool(second[s]) for s in shared]
    a_only, b_only, p = mcnemar_exact(a, b)
    return {
        "n_pairs": len(shared),
        "asr_a": sum(a) / len(a) if a else float("nan"),
        "asr_b": sum(b) / len(b) if b else float("nan"),
        "a_only": a_only,
        "b_only": b_only,
        "p": p,
    }


def _with_holm(results: list[dict[str, object]], keys: dict[str, Any], alpha: float) -> pl.DataFrame:
    adjusted = holm([float(r["p"]) for r in results])  # type: ignore[arg-type]
    for result, p_holm in zip(results, adjusted, strict=True):
        result["p_holm"] = p_holm
        result["significant"] = p_holm < alpha
    schema = {
        **keys,
        "n_pairs": pl.Int64,
        "asr_a": pl.Float64,
        "asr_b": pl.Float64,
        "a_only": pl.Int64,
        "b_only": pl.Int64,
        "p": pl.Float64,
        "p_holm": pl.Float64,
        "significant": pl.Boolean,
    }
    return pl.DataFrame(results, schema=schema)
