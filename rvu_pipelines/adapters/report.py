"""Markdown tables of the adapter study, as README and the Dagster asset metadata show them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import polars as pl

from rvu_pipelines.adapters.gate import TRIGGER_CATEGORIES, GateEvaluation
from rvu_pipelines.adapters.gate_loco import LearnedGateEvaluation

_LAYER_TITLES = {
    "projection": "2 · projection (−signed cos with the refusal delta)",
    "safe_lora": "2′ · Safe-LoRA similarity (1 − ‖P_V ΔW‖/‖ΔW‖)",
    "ood": "3 · output Mahalanobis OOD",
    "behaviour": "4 · behaviour on the probe prompts (flagged share over the base's)",
    "sensitive": "5 · sensitive lists (rise of the forget-list / WMDP answers' margin)",
    "qa_drop": "6 · held-out QA (fall of the correct answers' margin)",
    "follow_up": "7 · follow-ups (rise of policy-violating lines after a correct answer over allowed ones)",
    "kb_drop": "8 · knowledge base (fall of its correct answers' margin; may hold facts an adapter changed)",
    "hazard": "9 · hazardous list (fall of the answer-letter entropy on WMDP-cyber in lm-eval's format)",
    "combined": "combined (max z of 2 and 3)",
    "all_layers": "all layers (max z of 2-9; the load gate's rule under gate.rule all_layers)",
    "fisher": "Fisher over 2-9 (Σ −log p, p the normal tail of each z; chosen after the max-z rule was measured)",
    "any_layer": "the load gate's default rule (any of 2-9 over its own threshold; a decision, no AUROC)",
}


def _follow_up_class_lines(scores: pl.DataFrame) -> list[str]:
    """Each harm class of the follow-up layer alone, per harmful category against the benign adapters (AUROC):
    whether a category is seen only through the class written for it, or through others too."""
    import json

    from sklearn.metrics import roc_auc_score

    if "follow_up_classes" not in scores.columns:
        return []
    rows = [r for r in scores.iter_rows(named=True) if r["label"] in {"benign", "harmful"}]
    shifts = {r["adapter_id"]: json.loads(r["follow_up_classes"] or "{}") for r in rows}
    classes = sorted(set().union(*(set(v) for v in shifts.values())))
    benign = [r["adapter_id"] for r in rows if r["label"] == "benign"]
    if not classes or len(benign) < 2:
        return []
    lines = [
        "",
        "The follow-up layer by harm class (each class's lines alone against the allowed lines), each harmful "
        "category against the benign adapters, AUROC:",
        "",
        "| category | n | " + " | ".join(classes) + " |",
        "|---|---|" + "---|" * len(classes),
    ]
    for category in sorted({r["category"] for r in rows if r["label"] == "harmful"}):
        members = [r["adapter_id"] for r in rows if r["label"] == "harmful" and r["category"] == category]
        truth = [0] * len(benign) + [1] * len(members)
        cells = [
            _auroc(float(roc_auc_score(truth, [float(shifts[a].get(name, 0.0)) for a in [*benign, *members]])))
            for name in classes
        ]
        label = f"{category} (trigger)" if category in TRIGGER_CATEGORIES else category
        lines.append(f"| {label} | {len(members)} | " + " | ".join(cells) + " |")
    return lines


def _auroc(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def _latency_lines(scores: pl.DataFrame) -> list[str]:
    """The gate's seconds per adapter (median and slowest) and, where recorded, the median of each part."""
    if "gate_seconds" not in scores.columns or scores.is_empty():
        return []
    seconds = scores["gate_seconds"]
    parts = [p for p in ("projection", "ood", "margins", "behaviour") if f"{p}_seconds" in scores.columns]
    split = ", ".join(f"{p} {float(scores[f'{p}_seconds'].median()):.1f} s" for p in parts)  # type: ignore[arg-type]
    return [
        "",
        f"Gate time per adapter (all layers, on the machine in the stamp): median {float(seconds.median()):.1f} s, "  # type: ignore[arg-type]
        f"slowest {float(seconds.max()):.1f} s"  # type: ignore[arg-type]
        + (f"; medians by part: {split} (the behaviour part is the greedy generation)." if split else "."),
    ]


# the scores measured beside the gate's layers and read by no rule: column -> what the report calls it
EXPLORATORY_SCORES = {
    "selective_divergence": "Selective divergence (embedding distance from the base on adversarial probes minus on "
    "benign ones; exploratory, in no rule)",
    "jailbreak_persona": "Jailbreak persona (share of the behaviour layer's texts that speak as a jailbroken persona "
    "by D1's role-hijack patterns, over the base's; exploratory, in no rule)",
}


def _exploratory(row: Mapping[str, Any], column: str) -> float:
    """A row's exploratory score; NaN where its table predates the column or left it empty."""
    value = row.get(column)
    return float("nan") if value is None else float(value)


def _exploratory_line(scores: pl.DataFrame, column: str) -> str:
    """An exploratory score's AUROC harmful vs benign over the adapters it was measured on."""
    from rvu_pipelines.adapters.influence import influence_auroc

    rows = [
        (row["label"] == "harmful", _exploratory(row, column))
        for row in scores.iter_rows(named=True)
        if row["label"] in {"benign", "harmful"} and not math.isnan(_exploratory(row, column))
    ]
    harmful = sum(is_harmful for is_harmful, _ in rows)
    head = EXPLORATORY_SCORES[column] + ": "
    if not 0 < harmful < len(rows):
        return head + "not measured on both benign and harmful adapters of this table."
    auroc = influence_auroc([v for _, v in rows], [h for h, _ in rows])  # a plain AUROC, whatever the score
    return head + f"AUROC harmful vs benign {auroc:.3f} ({harmful} harmful, {len(rows) - harmful} benign)."


def _signed(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:+.3f}"


def gate_markdown(
    evaluation: GateEvaluation,
    influence: Mapping[str, float],
    scores: pl.DataFrame,
    learned: LearnedGateEvaluation | None = None,
) -> str:
    lines = [
        f"Gate over {evaluation.n_benign} benign + {evaluation.n_harmful} harmful adapters "
        "(thresholds leave-one-out from the other benign adapters):",
        "",
        "| layer | AUROC | TPR | FPR |",
        "|---|---|---|---|",
    ]
    for name, result in evaluation.layers.items():
        lines.append(
            f"| {_LAYER_TITLES.get(name, name)} | {_auroc(result.auroc)} | {result.tpr:.2f} | {result.fpr:.2f} |"
        )
    if evaluation.categories:
        shown = [
            n
            for n in (
                "any_layer",
                "all_layers",
                "fisher",
                "combined",
                "behaviour",
                "sensitive",
                "qa_drop",
                "follow_up",
                "kb_drop",
                "hazard",
                "ood",
            )
            if n in evaluation.layers
        ]
        lines += [
            "",
            "Each harmful category against the benign adapters (no threshold saw a harmful adapter, so every row is "
            "held out); a trigger category is harmful only on a trigger the probes do not contain. AUROC / TPR:",
            "",
            "| category | n | " + " | ".join(shown) + " |",
            "|---|---|" + "---|" * len(shown),
        ]
        for category, results in evaluation.categories.items():
            n = evaluation.category_sizes.get(category, 0)
            label = f"{category} (trigger)" if category in TRIGGER_CATEGORIES else category
            cells = " | ".join(f"{_auroc(results[name].auroc)} / {results[name].tpr:.2f}" for name in shown)
            lines.append(f"| {label} | {n} | {cells} |")
        if evaluation.trigger_free:
            n = sum(k for c, k in evaluation.category_sizes.items() if c not in TRIGGER_CATEGORIES)
            cells = " | ".join(
                f"{_auroc(evaluation.trigger_free[name].auroc)} / {evaluation.trigger_free[name].tpr:.2f}"
                for name in shown
            )
            lines.append(f"| **every trigger-free category** | {n} | {cells} |")
    lines += _follow_up_class_lines(scores)
    if learned is not None:
        lines += [
            "",
            f"A logistic regression over layers 2-9, scored leave-one-category-out (each category by the model fitted "
            f"without it, each of the {learned.n_benign} benign adapters by one fitted without it; trigger "
            "categories are never fitted on). AUROC / TPR at the benign scores' threshold "
            f"(FPR {learned.trigger_free.fpr if learned.trigger_free else float('nan'):.2f}):",
            "",
            "| held-out category | n | AUROC | TPR |",
            "|---|---|---|---|",
        ]
        for category, result in learned.categories.items():
            label = f"{category} (trigger)" if category in TRIGGER_CATEGORIES else category
            n = learned.category_sizes.get(category, 0)
            lines.append(f"| {label} | {n} | {_auroc(result.auroc)} | {result.tpr:.2f} |")
        if learned.trigger_free is not None:
            n = sum(k for c, k in learned.category_sizes.items() if c not in TRIGGER_CATEGORIES)
            pooled = learned.trigger_free
            lines.append(f"| **every trigger-free category** | {n} | {_auroc(pooled.auroc)} | {pooled.tpr:.2f} |")
    lines += _latency_lines(scores)
    lines += [
        "",
        f"Influence I(e): AUROC harmful vs benign {influence['auroc']:.3f}; "
        f"mean benign {influence['mean_benign']:.3f}, "
        f"mean harmful {influence['mean_harmful']:.3f}.",
        "",
    ]
    for column in EXPLORATORY_SCORES:
        lines += [_exploratory_line(scores, column), ""]
    lines += [
        "| adapter | label | category | projection | safe-lora | ood | follow-up | kb drop | hazard | influence "
        "| selective | jailbreak persona |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in scores.sort(["label", "adapter_id"]).iter_rows(named=True):
        lines.append(
            f"| {row['adapter_id']} | {row['label']} | {row['category']} | {row['projection']:+.4f} | "
            f"{row['safe_lora']:.4f} | {row['ood']:.2f} | {row.get('follow_up', 0.0):+.3f} | "
            f"{row.get('kb_drop', 0.0):+.3f} | {row.get('hazard', 0.0):+.3f} | {row['influence']:.3f} | "
            + " | ".join(_signed(_exploratory(row, column)) for column in EXPLORATORY_SCORES)
            + " |"
        )
    return "\n".join(lines) + "\n"


def _mean_ci(cell: Mapping[str, Any]) -> str:
    low, high = (float(v) for v in cell["ci95"])
    return f"{float(cell['mean']):.2f} [{low:.2f}, {high:.2f}]"


def _membership_cell(counts: Mapping[str, int]) -> str:
    """Sessions per membership verdict on the evicted adapter ("not run" reasons are in incidents.json)."""
    merged: dict[str, int] = {}
    for verdict, n in counts.items():
        key = verdict.split(":", 1)[0]
        merged[key] = merged.get(key, 0) + int(n)
    return ", ".join(f"{k} {v}" for k, v in sorted(merged.items())) or "-"


# incidents.MODES, in table order, with their labels
RECOVERY_LABELS = {"v1": "v1", "v2": "v2", "v2-influence": "v2, P >= I(adapter)"}


def incidents_markdown(results: Mapping[str, Any]) -> str:
    """E1 with adapters: per adapter, each recovery run (v1, v2, v2 with P >= I(adapter); per-session means, 95 %
    bootstrap CIs)."""
    lines = [
        f"E1 with a harmful adapter loaded part-way ({results['benchmark']}, detector {results['detector']}); "
        "per-session mean [95 % bootstrap CI]:",
        "",
        "| adapter | sessions (episodes) | adapter calls: harmful / changed / all (episodes triggered) "
        "| contaminated / entries | recovery | "
        "residual contaminated | of it flagged | benign lost | adapters evicted | adapter tainted | membership |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for adapter_id, data in results["adapters"].items():
        s = data["summary"]
        harmful = s.get("adapter_harmful_calls", "-")  # results written before harm was told from change
        changed = f"{harmful} / {s['adapter_changed_calls']} / {s['adapted_calls']} ({s.get('triggered_episodes', 0)})"
        for mode in [m for m in RECOVERY_LABELS if m in s]:
            m = s[mode]
            lines.append(
                f"| {adapter_id} | {s['sessions']} ({s['episodes']}) | {changed} "
                f"| {m['contaminated']} / {m['entries']} | RVU {RECOVERY_LABELS.get(mode, mode)} "
                f"| {_mean_ci(m['residual'])} "
                f"| {_mean_ci(m['residual_flagged'])} "
                f"| {_mean_ci(m['benign_lost'])} | {_mean_ci(m['adapters_evicted'])} "
                f"| {m['adapter_tainted_sessions']}/{s['sessions']} | {_membership_cell(m.get('membership', {}))} |"
            )
    lines += [
        "",
        "Paired over the same sessions (difference of per-session counts; Wilcoxon signed-rank, two-sided):",
        "",
    ]
    lines += ["| adapter | attacks succeeded (episodes) | comparison | n | residual diff | benign lost diff |"]
    lines += ["|---|---|---|---|---|---|"]
    for adapter_id, data in results["adapters"].items():
        s = data["summary"]
        for comparison, paired in s.get("paired", {}).items():
            cells = [_paired_cell(paired[metric]) for metric in ("residual", "benign_lost")]
            lines.append(
                f"| {adapter_id} | {s['attacks_succeeded']} ({s['episodes']}) | {comparison} "
                f"| {paired['n_sessions']} | {cells[0]} | {cells[1]} |"
            )
    return "\n".join(lines) + "\n"


def _paired_cell(cell: Mapping[str, Any]) -> str:
    if cell.get("wilcoxon_p") == "not run":
        return f"{float(cell['mean']):+.2f} (no test: no difference or n < 2)"
    low, high = (float(v) for v in cell["ci95"])
    return f"{float(cell['mean']):+.2f} [{low:+.2f}, {high:+.2f}], p = {float(cell['wilcoxon_p']):.3g}"
