"""Per-layer histograms per class (with the calibrated threshold) and ROC curves, as PNG files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rvu_pipelines.atomic_write import write_stream_atomically
from rvu_pipelines.spectral.graph import STAT_NAMES


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def layer_histograms(
    values: np.ndarray,
    labels: np.ndarray,
    path: str | Path,
    *,
    statistic: str = "hfer",
    layers: Sequence[int] | None = None,
    title: str = "",
    threshold: tuple[int, float] | None = None,
    class_names: tuple[str, str] = ("pass (0)", "fire (1)"),
) -> Path:
    """One panel per layer: the statistic's histogram for each class; ``threshold=(layer, value)`` draws it
    (in the statistic's own units) on that layer's panel."""
    plt = _pyplot()
    chosen = list(range(values.shape[1])) if layers is None else list(layers)
    index = STAT_NAMES.index(statistic)
    columns = 6
    rows = int(np.ceil(len(chosen) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.0 * columns, 2.2 * rows), squeeze=False)
    y = np.asarray(labels).astype(bool)
    for panel, layer in zip(axes.flat, chosen, strict=False):
        column = values[:, layer, index]
        bins = np.linspace(float(column.min()), float(column.max()) + 1e-12, 30)
        panel.hist(column[~y], bins=bins, alpha=0.6, label=class_names[0], color="tab:blue")
        panel.hist(column[y], bins=bins, alpha=0.6, label=class_names[1], color="tab:red")
        if threshold is not None and threshold[0] == layer:
            panel.axvline(threshold[1], color="black", linestyle="--", linewidth=1)
        panel.set_title(f"layer {layer}", fontsize=9)
        panel.tick_params(labelsize=7)
    for panel in list(axes.flat)[len(chosen) :]:
        panel.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title or f"{statistic} per layer and class", fontsize=11)
    fig.tight_layout()
    out = write_stream_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=80))
    plt.close(fig)
    return out


def roc_curves(curves: dict[str, tuple[np.ndarray, np.ndarray]], path: str | Path, title: str = "ROC") -> Path:
    """``curves``: name -> (labels, scores), higher score = fire."""
    from sklearn.metrics import roc_auc_score, roc_curve

    plt = _pyplot()
    fig, axis = plt.subplots(figsize=(4.5, 4.5))
    for name, (labels, scores) in curves.items():
        fpr, tpr, _ = roc_curve(labels, scores)
        axis.plot(fpr, tpr, label=f"{name} (AUROC {roc_auc_score(labels, scores):.3f})")
    axis.plot([0, 1], [0, 1], color="grey", linestyle=":")
    axis.set_xlabel("false positive rate")
    axis.set_ylabel("true positive rate")
    axis.set_title(title)
    axis.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = write_stream_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=80))
    plt.close(fig)
    return out
