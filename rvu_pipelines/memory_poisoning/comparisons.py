"""Paired detector comparisons on the matrix's own examples, Bonferroni-corrected over the whole table.

Every comparison pits the reference detector (MEMSAD, the seed's) against one other detector on the same
poisons and benign writes of one (attack, history) cell: ΔAUROC = AUROC(reference) − AUROC(other), its
interval and two-sided p-value from a paired bootstrap that resamples memory records (a benign record
scored in several MINJA victim settings is one draw). The family is every comparison the table makes, so
each is tested at α/m with m the table's size, not the cell's; a "significant" row survives that.

The histories compared by default are the write-time defender's (``plain``) and the seed's all-triggered one
(``triggered``): the two ends of the timeline. The mixed histories are in the matrix, not in this family.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning import stats
from rvu_pipelines.memory_poisoning.study import CellScores

REFERENCE = "memsad"
COMPARED_CALIBRATIONS = ("plain", "triggered")
COMPARISON_RESAMPLES = 4000  # p-values resolve to 1/4000, below α/m for the table's ~50 comparisons

Key = tuple[str, str, str]  # (attack, defense, calibration)


def comparison_family(
    raw: Mapping[Key, CellScores], reference: str = REFERENCE, calibrations: Sequence[str] = COMPARED_CALIBRATIONS
) -> dict[tuple[str, str], list[str]]:
    """(attack, calibration) -> the detectors compared with the reference there, sorted."""
    family: dict[tuple[str, str], list[str]] = {}
    for attack, defense, calibration in sorted(raw):
        if calibration in calibrations and defense != reference and (attack, reference, calibration) in raw:
            family.setdefault((attack, calibration), []).append(defense)
    return family


def _same_examples(first: CellScores, other: CellScores, where: str) -> None:
    if first.poison_keys != other.poison_keys or first.benign_keys != other.benign_keys:
        raise MemoryPoisoningInputError(
            f"{where}: the two detectors scored different examples; a paired test needs the same"
        )


def paired_comparisons(
    raw: Mapping[Key, CellScores],
    *,
    reference: str = REFERENCE,
    calibrations: Sequence[str] = COMPARED_CALIBRATIONS,
    alpha: float = stats.DEFAULT_ALPHA,
    n_resamples: int = COMPARISON_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
) -> pl.DataFrame:
    """One row per (attack, calibration, other detector), sorted; m = every row of the table."""
    family = comparison_family(raw, reference, calibrations)
    m = sum(len(others) for others in family.values())
    if m == 0:
        raise MemoryPoisoningInputError(
            f"no comparison to make: the matrix has no {reference!r} row beside another detector "
            f"under {list(calibrations)}"
        )
    rows = []
    for (attack, calibration), others in sorted(family.items()):
        base = raw[(attack, reference, calibration)]
        for other in others:
            _same_examples(base, raw[(attack, other, calibration)], f"{attack} ({calibration}) {reference} vs {other}")
        labels = np.r_[np.ones(len(base.poison_margins)), np.zeros(len(base.benign_margins))]
        scores = {
            name: np.r_[
                raw[(attack, name, calibration)].poison_margins, raw[(attack, name, calibration)].benign_margins
            ]
            for name in (reference, *others)
        }
        clusters = base.clusters()
        results = stats.compare_aurocs(
            labels,
            scores,
            pairs=[(reference, other) for other in others],
            alpha=alpha,
            n_resamples=n_resamples,
            seed=seed,
            clusters=clusters,
            family_size=m,
        )
        n_records = len(set(base.benign_keys)) if base.benign_keys else len(base.benign_margins)
        for r in results:
            rows.append(
                {
                    "attack": attack,
                    "calibration": calibration,
                    **{k: v for k, v in r.as_dict().items() if k not in ("seed", "method")},
                    "n_benign_records": n_records,
                }
            )
    return pl.DataFrame(rows).sort(["attack", "calibration", "b"])


def comparisons_markdown(table: pl.DataFrame) -> str:
    """ΔAUROC per (attack, history, detector) with its interval, raw and Bonferroni-adjusted p, and n."""
    if table.is_empty():
        return "No comparisons."
    first = table.row(0, named=True)
    lines = [
        f"| attack | history | {first['a']} vs | AUROC {first['a']} | AUROC other | ΔAUROC [95% CI] | p | p × m | "
        f"significant at α/m | n poisons / benign writes (records) |",
        "|---" * 10 + "|",
    ]
    for r in table.iter_rows(named=True):
        lines.append(
            f"| {r['attack']} | {r['calibration']} | {r['b']} | {r['auroc_a']:.3f} | {r['auroc_b']:.3f} | "
            f"{r['difference']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['p_value']:.4f} | "
            f"{r['p_adjusted']:.4f} | {'yes' if r['significant'] else 'no'} | "
            f"{r['n_positive']} / {r['n_negative']} ({r['n_benign_records']}) |"
        )
    return "\n".join(lines) + (
        f"\n\nm = {first['m']} comparisons (every row), each tested at α/m = {first['alpha']:g}/{first['m']} = "
        f"{first['alpha_corrected']:.5f}; paired bootstrap over memory records ({first['n_resamples']} resamples), "
        "p two-sided. A negative Δ means the other detector separates this cell better than the reference."
    )
