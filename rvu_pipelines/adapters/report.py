"""Markdown tables of the adapter study, as README and the Dagster asset metadata show them."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from rvu_pipelines.adapters.gate import GateEvaluation

_LAYER_TITLES = {
    "projection": "2 · projection (−signed cos with the refusal delta)",
    "safe_lora": "2′ · Safe-LoRA similarity (1 − ‖P_V ΔW‖/‖ΔW‖)",
    "ood": "3 · output Mahalanobis OOD",
    "combined": "combined (max z of 2 and 3)",
}


def gate_markdown(evaluation: GateEvaluation, influence: Mapping[str, float], scores: pl.DataFrame) -> str:
    lines = [
        f"Gate over {evaluation.n_benign} benign + {evaluation.n_harmful} harmful adapters "
        "(thresholds leave-one-out from the other benign adapters):",
        "",
        "| layer | AUROC | TPR | FPR |",
        "|---|---|---|---|",
    ]
    for name, result in evaluation.layers.items():
        lines.append(f"| {_LAYER_TITLES.get(name, name)} | {result.auroc:.3f} | {result.tpr:.2f} | {result.fpr:.2f} |")
    lines += [
        "",
        f"Influence I(e): AUROC harmful vs benign {influence['auroc']:.3f}; "
        f"mean benign {influence['mean_benign']:.3f}, "
        f"mean harmful {influence['mean_harmful']:.3f}.",
        "",
        "| adapter | label | category | projection | safe-lora | ood | influence |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in scores.sort(["label", "adapter_id"]).iter_rows(named=True):
        lines.append(
            f"| {row['adapter_id']} | {row['label']} | {row['category']} | {row['projection']:+.4f} | "
            f"{row['safe_lora']:.4f} | {row['ood']:.2f} | {row['influence']:.3f} |"
        )
    return "\n".join(lines) + "\n"
