"""Tables and plots of the memory-poisoning study: the paper's numbers beside ours, ROC curves, score
histograms with the threshold drawn, where people would rather look than read."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.metrics import roc_curve

from rvu_pipelines.atomic_write import write_stream_atomically
from rvu_pipelines.memory_poisoning.attack_catalog import registered_poisoning_attacks
from rvu_pipelines.memory_poisoning.study import PAPER_AUROC, PAPER_TPR, CellScores
from rvu_pipelines.memory_poisoning.study_cells import ATTACKS

HISTORY_ORDER = ("plain", "triggered_1pct", "triggered_2pct", "triggered_5pct", "triggered_25pct", "triggered")


def _main_rows(table: pl.DataFrame) -> pl.DataFrame:
    """One row per (attack, defense): AgentPoison with triggered calibration (the paper's protocol)."""
    two_histories = table.group_by("attack").agg(pl.col("calibration").n_unique().alias("n")).filter(pl.col("n") > 1)
    keep = ~pl.col("attack").is_in(two_histories["attack"].to_list()) | (pl.col("calibration") == "triggered")
    return table.filter(keep)


def paper_comparison_markdown(table: pl.DataFrame) -> str:
    """The paper's AUROC / TPR-at-threshold table with ours beside it (95 % CIs, n)."""
    rows = _main_rows(table)
    specs = registered_poisoning_attacks()
    labels = {name: spec.label for name, spec in specs.items()}
    attacks = [a for a in ATTACKS if specs[a].in_paper and a in set(rows["attack"].to_list())]
    head = " | ".join(f"AUROC {labels[a]} paper / ours [95% CI]" for a in attacks)
    tpr_head = " | ".join(f"TPR {labels[a]} paper / ours [95% CI]" for a in attacks)
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
        f"{labels[a]}: {r['n_poisons']} poisons vs {r['n_benign']} benign writes "
        f"({r['n_benign_records']} distinct records)"
        for a in attacks
        for r in [rows.filter(pl.col("attack") == a).row(0, named=True)]
    )
    return "\n".join(lines) + (
        f"\n\nn: {ns}. AgentPoison rows use the seed's history of triggered victim queries only, which a "
        "write-time defender does not have (the poisons are written before any victim sends the trigger): "
        "write_time.md has every detector against the histories it does have."
    )


def write_time_markdown(table: pl.DataFrame) -> str:
    """AUROC and TPR / FPR at threshold per defense against each history a write-time defender may hold, for
    AgentPoison and its random-trigger control (n poisons / benign writes and the history size stated)."""
    mixed = table.filter(pl.col("calibration") == HISTORY_ORDER[1])["attack"].unique().to_list()
    rows = table.filter(pl.col("attack").is_in(mixed))
    if rows.is_empty():
        return "No attack in this run has a plain and a triggered history."
    histories = [h for h in HISTORY_ORDER if h in set(rows["calibration"].to_list())]
    lines = []
    for attack in sorted(set(rows["attack"].to_list())):
        one = rows.filter(pl.col("attack") == attack)
        sizes = {r["calibration"]: (r["n_history_triggered"], r["n_history"]) for r in one.iter_rows(named=True)}
        head = " | ".join(f"{h} ({sizes[h][0]}/{sizes[h][1]})" for h in histories)
        first = one.row(0, named=True)
        lines += [
            f"**{attack}** ({first['n_poisons']} poisons, {first['n_benign']} benign writes); columns: the history "
            "(triggered / all queries in it); cells: AUROC [95% CI], TPR / FPR at threshold",
            "",
            f"| defense | {head} |",
            "|---" * (1 + len(histories)) + "|",
        ]
        for defense in sorted(set(one["defense"].to_list())):
            cells = []
            for h in histories:
                r = one.filter((pl.col("defense") == defense) & (pl.col("calibration") == h)).row(0, named=True)
                cells.append(
                    f"{r['auroc']:.3f} [{r['auroc_low']:.2f}, {r['auroc_high']:.2f}], {r['tpr']:.2f} / {r['fpr']:.3f}"
                )
            lines.append(f"| {defense} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


def retro_scan_markdown(table: pl.DataFrame, goal_triggered: int, goal_fpr: float) -> str:
    """The retro-scan per (attack, defense): TPR at write time and by the end, time to flag, harm, FPR."""
    if table.is_empty():
        return "No retro-scan in this run."
    lines = [
        "| attack | defense | TPR at write | TPR by end [95% CI] (sd over seeds) | triggered queries to flag "
        "(median / max) | poisoned retrievals before flag / undefended | FPR [95% CI] | n poisons / benign | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.iter_rows(named=True):
        lines.append(
            f"| {r['attack']} | {r['defense']} | {r['tpr_write_time']:.2f} | {r['tpr']:.2f} "
            f"[{r['tpr_low']:.2f}, {r['tpr_high']:.2f}] ({r['tpr_seed_sd']:.2f}) | "
            f"{r['median_triggered_to_flag']:.0f} / {r['max_triggered_to_flag']:.0f} | "
            f"{r['poisoned_retrievals_before_flag']} / {r['poisoned_retrievals_undefended']} | {r['fpr']:.3f} "
            f"[{r['fpr_low']:.3f}, {r['fpr_high']:.3f}] | {r['n_poisons']} / {r['n_benign']} | "
            f"{'met' if r['goal_met'] else 'not met'} |"
        )
    first = table.row(0, named=True)
    return "\n".join(lines) + (
        f"\n\nEach stream: {first['n_served']} queries served after the write, {first['n_triggered_served']} of them "
        f"triggered, {first['n_seeds']} seeds (counts pooled). Write-time check against plain traffic only; the scan "
        f"re-scores every stored entry after each query. Goal: every poison flagged within {goal_triggered} triggered "
        f"queries at FPR <= {goal_fpr:.0%}. NaN: no poison flagged."
    )


def plot_retro_scan(curves: Mapping[tuple[str, str], list[list[tuple[int, float]]]], path: Path) -> Path:
    """Share of poisons flagged against triggered queries served, per (attack, defense), mean over seeds."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for (attack, defense), runs in sorted(curves.items()):
        steps = min(len(c) for c in runs)
        mean = np.mean([[share for _, share in c[:steps]] for c in runs], axis=0)
        ax.plot(range(steps), mean, label=f"{attack} / {defense}", ls="-" if attack == "agentpoison" else "--")
    ax.set_xlabel("triggered victim queries served since the write")
    ax.set_ylabel("share of poisons flagged")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_stream_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path


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


def agg_pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display), imported when a plot is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_roc_curves(raw: Mapping[tuple[str, str, str], CellScores], path: Path, calibration: str = "triggered") -> Path:
    """ROC per attack (one panel each), every detector; AgentPoison with ``calibration``."""
    plt = agg_pyplot()
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
    write_stream_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path


def plot_score_histograms(raw: Mapping[tuple[str, str, str], CellScores], path: Path, defense: str = "memsad") -> Path:
    """Score margins (score - threshold) of poisons vs benign writes, threshold at 0, per (attack, calibration)."""
    plt = agg_pyplot()
    keys = sorted(k for k in raw if k[1] == defense and k[2] in ("plain", "triggered"))
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
    write_stream_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path
