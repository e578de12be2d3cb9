"""Tables and plots of the memory-poisoning study: the paper's numbers beside ours, ROC curves, score
histograms with the threshold drawn, where people would rather look than read."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.metrics import roc_curve

from rvu_pipelines.memory_poisoning.study import PAPER_AUROC, PAPER_TPR, CellScores

ATTACK_LABEL = {"agentpoison": "AP", "minja": "MJ", "injecmem": "IM"}


def _main_rows(table: pl.DataFrame) -> pl.DataFrame:
    """One row per (attack, defense): AgentPoison with triggered calibration (the paper's protocol)."""
    keep = (pl.col("attack") != "agentpoison") | (pl.col("calibration") == "triggered")
    return table.filter(keep)


def paper_comparison_markdown(table: pl.DataFrame) -> str:
    """The paper's AUROC / TPR-at-threshold table with ours beside it (95 % CIs, n)."""
    rows = _main_rows(table)
    attacks = [a for a in ("agentpoison", "minja", "injecmem") if a in set(rows["attack"].to_list())]
    head = " | ".join(f"AUROC {ATTACK_LABEL[a]} paper / ours [95% CI]" for a in attacks)
    tpr_head = " | ".join(f"TPR {ATTACK_LABEL[a]} paper / ours [95% CI]" for a in attacks)
    lines = [f"| defense | {head} | {tpr_head} |", "|---" * (1 + 2 * len(attacks)) + "|"]
    for defense in sorted(set(rows["defense"].to_list())):
        cells_auroc, cells_tpr = [], []
        for attack in attacks:
            r = rows.filter((pl.col("attack") == attack) & (pl.col("defense") == defense)).row(0, named=True)
            paper_a = PAPER_AUROC.get(defense, {}).get(attack)
            paper_t = PAPER_TPR.get(defense, {}).get(attack)
            cells_auroc.append(
                f"{'—' if paper_a is None else f'{paper_a:.3f}'} / **{r['auroc']:.3f}** "
                f"[{r['auroc_low']:.3f}, {r['auroc_high']:.3f}]"
            )
            cells_tpr.append(
                f"{'—' if paper_t is None else f'{paper_t:.2f}'} / **{r['tpr']:.2f}** "
                f"[{r['tpr_low']:.2f}, {r['tpr_high']:.2f}] (FPR {r['fpr']:.3f})"
            )
        lines.append(f"| {defense} | " + " | ".join(cells_auroc + cells_tpr) + " |")
    ns = ", ".join(
        f"{ATTACK_LABEL[a]}: {r['n_poisons']} poisons vs {r['n_benign']} benign writes"
        for a in attacks
        for r in [rows.filter(pl.col("attack") == a).row(0, named=True)]
    )
    return "\n".join(lines) + f"\n\nn: {ns}. AgentPoison rows use triggered calibration (the paper's)."


def retrieval_markdown(table: pl.DataFrame) -> str:
    """ASR-R undefended -> defended and benign retrieval accuracy per (attack, defense, calibration)."""
    lines = [
        "| attack | defense | calibration | ASR-R undefended | ASR-R defended | n victims | benign accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table.iter_rows(named=True):
        lines.append(
            f"| {r['attack']} | {r['defense']} | {r['calibration']} | {r['asr_r_undefended']:.2f} | "
            f"{r['asr_r_defended']:.2f} | {r['n_victim_queries']} | {r['benign_accuracy']:.3f} |"
        )
    return "\n".join(lines)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_roc_curves(raw: Mapping[tuple[str, str, str], CellScores], path: Path, calibration: str = "triggered") -> Path:
    """ROC per attack (one panel each), every detector; AgentPoison with ``calibration``."""
    plt = _plt()
    attacks = sorted({a for a, _, _ in raw})
    fig, axes = plt.subplots(1, len(attacks), figsize=(5 * len(attacks), 4.5), squeeze=False)
    for ax, attack in zip(axes[0], attacks, strict=True):
        cal = calibration if (attack, "memsad", calibration) in raw else "plain"
        for (a, defense, c), scores in sorted(raw.items()):
            if a != attack or c != cal:
                continue
            y = np.r_[np.ones(len(scores.poison_margins)), np.zeros(len(scores.benign_margins))]
            fpr, tpr, _ = roc_curve(y, np.r_[scores.poison_margins, scores.benign_margins])
            ax.plot(fpr, tpr, label=defense)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.5, ls="--")
        ax.set_title(f"{attack} ({cal} calibration)")
        ax.set_xlabel("FPR (benign writes flagged)")
        ax.set_ylabel("TPR (poisons flagged)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_score_histograms(raw: Mapping[tuple[str, str, str], CellScores], path: Path, defense: str = "memsad") -> Path:
    """Score margins (score - threshold) of poisons vs benign writes, threshold at 0, per (attack, calibration)."""
    plt = _plt()
    keys = sorted(k for k in raw if k[1] == defense)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        scores = raw[key]
        bins = np.linspace(
            min(scores.poison_margins.min(), scores.benign_margins.min()),
            max(scores.poison_margins.max(), scores.benign_margins.max()),
            30,
        )
        ax.hist(
            scores.benign_margins, bins=bins, alpha=0.6, density=True, label=f"benign (n={len(scores.benign_margins)})"
        )
        ax.hist(
            scores.poison_margins, bins=bins, alpha=0.6, density=True, label=f"poison (n={len(scores.poison_margins)})"
        )
        ax.axvline(0.0, color="black", ls="--", label="threshold")
        ax.set_title(f"{defense}: {key[0]} ({key[2]})", fontsize=9)
        ax.set_xlabel("score - threshold")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
