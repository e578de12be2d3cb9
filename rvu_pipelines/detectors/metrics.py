"""Detection metrics of seed 002 §5.4 with what the paper lacked (§11.4): bootstrap 95% CIs.

Point estimates come from scikit-learn at threshold 0.5. CIs are percentile bootstrap intervals
over test examples (fixed seed, 1,000 resamples by default); resamples holding one class only are
skipped for AUROC and counted. Latency is wall time per text, one text per call ("single") and the
whole test split in one call ("batched").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from rvu_pipelines.atomic_write import write_stream_atomically
from rvu_pipelines.detectors.base import DEFAULT_THRESHOLD, InjectionDetector
from rvu_pipelines.errors import DetectorError

METRICS: tuple[str, ...] = ("accuracy", "precision", "recall", "f1", "auroc")
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 42
CI_LEVEL = 0.95


def _check(y: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y, scores = np.asarray(y, dtype=np.int64).reshape(-1), np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != scores.shape or y.size == 0:
        raise DetectorError(f"Metrics need one score per label; got {y.size} labels and {scores.size} scores.")
    if set(np.unique(y).tolist()) != {0, 1}:
        raise DetectorError("Metrics need both labels (0 and 1) among the test examples.")
    return y, scores


def point_metrics(y: np.ndarray, scores: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> dict[str, float]:
    """Accuracy, precision, recall, F1 at ``threshold`` and AUROC, via scikit-learn (precision 0 if no positives)."""
    from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score, roc_auc_score

    y, scores = _check(y, scores)
    predicted = (scores >= threshold).astype(np.int64)
    return {
        "accuracy": float(accuracy_score(y, predicted)),
        "precision": float(precision_score(y, predicted, zero_division=0)),
        "recall": float(recall_score(y, predicted, zero_division=0)),
        "f1": float(f1_score(y, predicted, zero_division=0)),
        "auroc": float(roc_auc_score(y, scores)),
    }


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros_like(num, dtype=np.float64), where=den > 0)


def bootstrap_cis(
    y: np.ndarray,
    scores: np.ndarray,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[dict[str, tuple[float, float]], int]:
    """Percentile CIs per metric, and how many resamples were skipped for AUROC (one class only)."""
    from scipy.stats import rankdata

    y, scores = _check(y, scores)
    if n_resamples < 10:
        raise DetectorError(f"n_resamples={n_resamples}: use at least 10 bootstrap resamples.")
    rng = np.random.Generator(np.random.PCG64(seed))
    index = rng.integers(0, y.size, size=(n_resamples, y.size))
    truth, score = y[index], scores[index]
    predicted = score >= threshold
    tp = (predicted & (truth == 1)).sum(axis=1).astype(np.float64)
    fp = (predicted & (truth == 0)).sum(axis=1).astype(np.float64)
    fn = (~predicted & (truth == 1)).sum(axis=1).astype(np.float64)
    positives = (truth == 1).sum(axis=1).astype(np.float64)
    negatives = y.size - positives
    values = {
        "accuracy": ((predicted == (truth == 1)).sum(axis=1)) / y.size,
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "f1": _ratio(2 * tp, 2 * tp + fp + fn),
    }
    both = (positives > 0) & (negatives > 0)
    ranks = rankdata(score[both], axis=1)  # average ranks for ties = the Mann-Whitney AUROC
    rank_sum = np.where(truth[both] == 1, ranks, 0.0).sum(axis=1)
    pos, neg = positives[both], negatives[both]
    values["auroc"] = (rank_sum - pos * (pos + 1) / 2) / (pos * neg)
    tail = (1.0 - level) / 2 * 100
    cis = {m: (float(np.percentile(values[m], tail)), float(np.percentile(values[m], 100 - tail))) for m in METRICS}
    return cis, int((~both).sum())


@dataclass(frozen=True)
class Latency:
    """Milliseconds per text: one text per ``score`` call, and the whole split in one call."""

    single_ms: float
    batched_ms: float
    n_single: int
    n_batched: int


def timed_score(detector: InjectionDetector, texts: Sequence[str]) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    scores = detector.score(list(texts))
    return scores, time.perf_counter() - start


def single_latency_ms(detector: InjectionDetector, texts: Sequence[str]) -> float:
    """Mean wall time of ``score([text])`` over ``texts``, after one untimed warm-up call."""
    if not texts:
        return float("nan")
    detector.score([texts[0]])
    start = time.perf_counter()
    for text in texts:
        detector.score([text])
    return (time.perf_counter() - start) * 1000.0 / len(texts)


@dataclass
class DetectorResult:
    """One detector on one test split: point metrics, CIs, latency, training time and the scores."""

    detector: str
    metrics: dict[str, float]
    cis: dict[str, tuple[float, float]]
    latency: Latency
    scores: np.ndarray = field(repr=False)
    train_seconds: float | None = None
    auroc_skipped_resamples: int = 0
    note: str = ""

    def row(self) -> dict[str, object]:
        row: dict[str, object] = {"detector": self.detector}
        for m in METRICS:
            row[m] = self.metrics[m]
            row[f"{m}_ci_low"], row[f"{m}_ci_high"] = self.cis[m]
        row.update(
            {
                "latency_single_ms": self.latency.single_ms,
                "latency_batched_ms": self.latency.batched_ms,
                "train_s": self.train_seconds,
                "note": self.note,
            }
        )
        return row


def evaluate_detector(
    detector: InjectionDetector,
    texts: Sequence[str],
    y: np.ndarray,
    *,
    n_single: int = 20,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    threshold: float = DEFAULT_THRESHOLD,
    train_seconds: float | None = None,
    note: str = "",
) -> DetectorResult:
    """Score the split once (batched latency), time ``n_single`` one-text calls, compute metrics + CIs."""
    scores, seconds = timed_score(detector, texts)
    single = single_latency_ms(detector, list(texts)[:n_single])
    return result_from_scores(
        detector.name,
        y,
        scores,
        Latency(single, seconds * 1000.0 / len(texts), min(n_single, len(texts)), len(texts)),
        n_resamples=n_resamples,
        seed=seed,
        threshold=threshold,
        train_seconds=train_seconds,
        note=note,
    )


def result_from_scores(
    name: str,
    y: np.ndarray,
    scores: np.ndarray,
    latency: Latency,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    threshold: float = DEFAULT_THRESHOLD,
    train_seconds: float | None = None,
    note: str = "",
) -> DetectorResult:
    cis, skipped = bootstrap_cis(y, scores, threshold, n_resamples=n_resamples, seed=seed)
    return DetectorResult(
        name, point_metrics(y, scores, threshold), cis, latency, np.asarray(scores), train_seconds, skipped, note
    )


TABLE_SCHEMA: dict[str, pl.DataType] = {
    "corpus": pl.String(),
    "detector": pl.String(),
    "n_test": pl.Int64(),
    "n_positive": pl.Int64(),
    **{name: pl.Float64() for m in METRICS for name in (m, f"{m}_ci_low", f"{m}_ci_high")},
    "latency_single_ms": pl.Float64(),
    "latency_batched_ms": pl.Float64(),
    "train_s": pl.Float64(),
    "note": pl.String(),
}


def results_table(corpus: str, y: np.ndarray, results: Sequence[DetectorResult]) -> pl.DataFrame:
    """One row per detector (in the given order, D1..D5), metrics as fractions with CI bounds."""
    rows = [{"corpus": corpus, "n_test": int(len(y)), "n_positive": int(np.sum(y)), **r.row()} for r in results]
    return pl.DataFrame(rows, schema=TABLE_SCHEMA)


def _pct(value: float, low: float, high: float) -> str:
    return f"{value * 100:.2f} [{low * 100:.1f}, {high * 100:.1f}]"


def table_markdown(table: pl.DataFrame) -> str:
    """The paper's Table 1-3 layout, percentages with 95% CIs, latency and training time."""
    header = [
        "Detector",
        *[m.upper() if m == "auroc" else m.capitalize() for m in METRICS],
        "Latency single (ms)",
        "Latency batched (ms)",
        "Train (s)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.iter_rows(named=True):
        cells = [
            row["detector"],
            *[_pct(row[m], row[f"{m}_ci_low"], row[f"{m}_ci_high"]) for m in METRICS],
            f"{row['latency_single_ms']:.2f}",
            f"{row['latency_batched_ms']:.2f}",
            "" if row["train_s"] is None else f"{row['train_s']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"{row['detector']}: {row['note']}" for row in table.iter_rows(named=True) if row["note"]]
    if notes:
        lines.append("")
        lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def plot_roc(curves: Mapping[str, tuple[np.ndarray, np.ndarray]], path: Path, title: str) -> Path:
    """ROC curves of several detectors in one PNG (no pyplot global state; fixed size and dpi)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from sklearn.metrics import roc_auc_score, roc_curve

    figure = Figure(figsize=(6, 5), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name, (y, scores) in curves.items():
        fpr, tpr, _ = roc_curve(y, scores)
        axes.plot(fpr, tpr, label=f"{name} (AUROC {roc_auc_score(y, scores) * 100:.2f})", linewidth=1.5)
    axes.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8)
    axes.set(xlabel="False positive rate", ylabel="True positive rate", title=title, xlim=(0, 1), ylim=(0, 1.01))
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    path = Path(path)
    write_stream_atomically(path, lambda handle: figure.savefig(handle, format="png", metadata={"Software": None}))
    return path
