"""Paired comparisons of defenses: the same scenarios under two defenses, exact McNemar, Holm over the table.

Every defense of a (benchmark, attack) row runs on the same scenarios, so two defenses are compared on the
scenarios both scored (errored episodes left out): only the discordant pairs (one defense stopped the attack, the
other did not) carry information, and under the null hypothesis each way is equally likely, so the exact test is
a binomial test on them. A table compares many pairs; Holm's step-down correction keeps the family-wise error at
``alpha`` over all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

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
        outcomes = {
            str(defense): dict(zip(part["scenario_id"].to_list(), part["attack_succeeded"].to_list(), strict=True))
            for (defense,), part in group.group_by(["defense"])
        }
        for first, second in combinations(sorted(outcomes), 2):
            shared = sorted(set(outcomes[first]) & set(outcomes[second]))
            a = [bool(outcomes[first][s]) for s in shared]
            b = [bool(outcomes[second][s]) for s in shared]
            a_only, b_only, p = mcnemar_exact(a, b)
            results.append(
                {
                    "benchmark": benchmark,
                    "attack": attack,
                    "defense_a": first,
                    "defense_b": second,
                    "n_pairs": len(shared),
                    "asr_a": sum(a) / len(a) if a else float("nan"),
                    "asr_b": sum(b) / len(b) if b else float("nan"),
                    "a_only": a_only,
                    "b_only": b_only,
                    "p": p,
                }
            )
    adjusted = holm([float(r["p"]) for r in results])  # type: ignore[arg-type]
    for result, p_holm in zip(results, adjusted, strict=True):
        result["p_holm"] = p_holm
        result["significant"] = p_holm < alpha
    schema = {
        "benchmark": pl.String,
        "attack": pl.String,
        "defense_a": pl.String,
        "defense_b": pl.String,
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
