"""One evaluation table for every injection detector, measured where the deployment meets it.

Columns (each with its n and a 95 % interval):

* ``in_dist_f1``: F1 at the detector's operating threshold on the test split of what it was trained on
  (deepset for D1-D5; the pooled test documents of its training sources for the production detector).
* ``lodo_auroc``: AUROC on each source the detector never trained on, windowed over whole documents; the
  worst source is the headline (``lodo_worst``), the mean beside it. For the production detector these are
  its leave-one-source-out folds.
* ``overdefense_fpr``: share of the over-defense set (benign text with trigger words) flagged at the
  operating threshold (Wilson interval); ``deployment_fpr`` the same on benign tool outputs of the test
  split; ``overdefense_fpr_at_tpr90`` at the threshold where the pooled injected test documents reach 90 % TPR.
* ``buried_tpr_<L>``: TPR at 1 % FPR on buried-injection pairs of L tokens (:mod:`buried`).
* latency: milliseconds per 512-token text, one text per call and 32 per call.

Controls beside the detectors: text length alone (a longer document is more likely to hold an
injection; a detector that does not beat length on a column has learned nothing there), and the trigger-word
template filter D1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rvu_pipelines.detectors.base import DEFAULT_THRESHOLD, DetectorBase, InjectionDetector
from rvu_pipelines.detectors.buried import tpr_at_fpr
from rvu_pipelines.detectors.production import bootstrap_auroc

LATENCY_TOKENS = 512
LATENCY_BATCH = 32


def wilson(successes: int, n: int) -> tuple[float, float]:
    """Wilson 95 % interval of a rate (scipy's)."""
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def bootstrap_f1(y: np.ndarray, predicted: np.ndarray, n_resamples: int = 1000, seed: int = 42) -> tuple[float, float]:
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(seed)
    draws = [
        f1_score(y[idx], predicted[idx], zero_division=0) for idx in rng.integers(0, y.size, (n_resamples, y.size))
    ]
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)


def bootstrap_tpr_at_fpr(
    y: np.ndarray, scores: np.ndarray, pair_ids: np.ndarray, fpr: float, n_resamples: int = 500, seed: int = 42
) -> tuple[float, float]:
    """Percentile interval of TPR at ``fpr``, resampling pairs (a benign document and its buried twin together)."""
    pairs = np.unique(pair_ids)
    index = {p: np.flatnonzero(pair_ids == p) for p in pairs}
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_resamples):
        rows = np.concatenate([index[p] for p in rng.choice(pairs, pairs.size)])
        draws.append(tpr_at_fpr(y[rows], scores[rows], fpr)[0])
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)


class LengthControl(DetectorBase):
    """The length control: longer text scores higher (tokens / (tokens + 512)); it knows nothing of content."""

    name = "control: length"

    def __init__(self, count: Callable[[str], int]) -> None:
        self.count = count

    def _score(self, texts: list[str]) -> np.ndarray:
        n = np.array([self.count(t) for t in texts], dtype=np.float64)
        return n / (n + 512.0)


@dataclass(frozen=True)
class ValidityData:
    """Everything the table is measured on (frames with columns text, label, source / pair as below)."""

    in_dist: pl.DataFrame  # deepset test: text, label
    documents: pl.DataFrame  # test documents of every source: text, label, source
    overdefense: pl.DataFrame  # benign trigger-word texts: text
    buried: pl.DataFrame  # buried pairs: text, label, length, pair
    latency_texts: list[str] = field(repr=False)


@dataclass(frozen=True)
class DetectorSpec:
    """A detector in the table, what it trained on, and (production only) its held-out AUROC from its folds."""

    key: str
    detector: InjectionDetector
    trained_on: frozenset[str]
    in_dist: pl.DataFrame | None = None  # its own in-distribution test set (default: ValidityData.in_dist)
    lodo: pl.DataFrame | None = None  # held_out, n, auroc, auroc_ci_low, auroc_ci_high
    timed: InjectionDetector | None = None  # the uncached detector to time, where ``detector`` memoizes scores


def _latency(detector: InjectionDetector, texts: Sequence[str]) -> tuple[float, float]:
    detector.score([texts[0]])
    single = texts[: min(8, len(texts))]
    start = time.perf_counter()
    for text in single:
        detector.score([text])
    single_ms = (time.perf_counter() - start) * 1000 / len(single)
    batch = list(texts[:LATENCY_BATCH])
    start = time.perf_counter()
    detector.score(batch)
    return single_ms, (time.perf_counter() - start) * 1000 / len(batch)


def evaluate_validity(
    specs: Sequence[DetectorSpec],
    data: ValidityData,
    *,
    n_resamples: int = 1000,
    log: Callable[[str], None] | None = None,
) -> pl.DataFrame:
    """One row per detector (see the module doc for the columns)."""
    from sklearn.metrics import f1_score, roc_auc_score

    say = log or (lambda _m: None)
    rows = []
    for spec in specs:
        start = time.perf_counter()
        row: dict[str, object] = {"detector": spec.key}
        detector = spec.detector
        home = spec.in_dist if spec.in_dist is not None else data.in_dist
        y = home["label"].to_numpy().astype(np.int64)
        predicted = (detector.score(home["text"].to_list()) >= DEFAULT_THRESHOLD).astype(np.int64)
        row["in_dist_n"] = int(y.size)
        row["in_dist_f1"] = float(f1_score(y, predicted, zero_division=0))
        row["in_dist_f1_ci_low"], row["in_dist_f1_ci_high"] = bootstrap_f1(y, predicted, n_resamples)
        if spec.lodo is not None:
            lodo = spec.lodo
        else:
            held = data.documents.filter(~pl.col("source").is_in(sorted(spec.trained_on)))
            folds = []
            for source in sorted(set(held["source"].to_list())):
                part = held.filter(pl.col("source") == source)
                yy = part["label"].to_numpy().astype(np.int64)
                scores = detector.score(part["text"].to_list())
                low, high = bootstrap_auroc(yy, scores, n_resamples)
                folds.append(
                    {
                        "held_out": source,
                        "n": int(yy.size),
                        "auroc": float(roc_auc_score(yy, scores)),
                        "auroc_ci_low": low,
                        "auroc_ci_high": high,
                    }
                )
            lodo = pl.DataFrame(folds)
        worst = lodo.sort("auroc").row(0, named=True)
        row["lodo_worst_source"] = worst["held_out"]
        row["lodo_worst_auroc"] = float(worst["auroc"])
        row["lodo_worst_ci_low"], row["lodo_worst_ci_high"] = (
            float(worst["auroc_ci_low"]),
            float(worst["auroc_ci_high"]),
        )
        row["lodo_mean_auroc"] = float(lodo["auroc"].mean())  # type: ignore[arg-type]
        row["lodo_n_sources"] = lodo.height
        row.update({f"lodo_auroc_{r['held_out']}": float(r["auroc"]) for r in lodo.iter_rows(named=True)})
        over = detector.score(data.overdefense["text"].to_list())
        flagged = int(np.sum(over >= DEFAULT_THRESHOLD))
        row["overdefense_n"] = int(over.size)
        row["overdefense_fpr"] = flagged / max(1, over.size)
        row["overdefense_fpr_ci_low"], row["overdefense_fpr_ci_high"] = wilson(flagged, int(over.size))
        docs = data.documents
        doc_scores = detector.score(docs["text"].to_list())
        doc_y = docs["label"].to_numpy().astype(np.int64)
        benign = doc_scores[doc_y == 0]
        row["deployment_n"] = int(benign.size)
        row["deployment_fpr"] = float(np.mean(benign >= DEFAULT_THRESHOLD))
        row["deployment_tpr"] = float(np.mean(doc_scores[doc_y == 1] >= DEFAULT_THRESHOLD))
        at90 = float(np.quantile(doc_scores[doc_y == 1], 0.10))  # 90 % of injected documents score >= it
        row["overdefense_fpr_at_tpr90"] = float(np.mean(over >= at90))
        for length in sorted(set(data.buried["length"].to_list())):
            part = data.buried.filter(pl.col("length") == length)
            yy = part["label"].to_numpy().astype(np.int64)
            scores = detector.score(part["text"].to_list())
            tpr, _ = tpr_at_fpr(yy, scores, 0.01)
            row[f"buried_tpr_{length}"] = tpr
            row[f"buried_n_{length}"] = int(part.height // 2)
            low, high = bootstrap_tpr_at_fpr(yy, scores, part["pair"].to_numpy(), 0.01, min(n_resamples, 300))
            row[f"buried_tpr_{length}_ci_low"], row[f"buried_tpr_{length}_ci_high"] = low, high
        row["latency_single_ms"], row["latency_batched_ms"] = _latency(spec.timed or detector, data.latency_texts)
        rows.append(row)
        say(f"{spec.key}: measured in {time.perf_counter() - start:.0f} s")
    return pl.DataFrame(rows)


def _pct(row: Mapping[str, object], key: str) -> str:
    value = row.get(key)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    low, high = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    if low is None or high is None:
        return f"{float(value) * 100:.1f}"  # type: ignore[arg-type]
    return f"{float(value) * 100:.1f} [{float(low) * 100:.1f}, {float(high) * 100:.1f}]"  # type: ignore[arg-type]


def validity_markdown(table: pl.DataFrame) -> str:
    """The table as markdown: percentages with 95 % intervals, n in the header notes."""
    lengths = sorted(int(c.rsplit("_", 1)[1]) for c in table.columns if c.startswith("buried_n_"))
    header = [
        "Detector",
        "in-dist F1",
        "LODO AUROC, worst source",
        "LODO AUROC, mean",
        "over-defense FPR @ op.",
        "over-defense FPR @ TPR 90",
        "benign tool-output FPR @ op.",
        *[f"buried TPR @ 1 % FPR, {n} tok" for n in lengths],
        "ms / 512 tok (single, batched)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.iter_rows(named=True):
        cells = [
            str(row["detector"]),
            _pct(row, "in_dist_f1"),
            f"{_auroc_cell(row)} ({row['lodo_worst_source']})",
            f"{row['lodo_mean_auroc']:.3f}",
            _pct(row, "overdefense_fpr"),
            f"{row['overdefense_fpr_at_tpr90'] * 100:.1f}",
            f"{row['deployment_fpr'] * 100:.1f}",
            *[_pct(row, f"buried_tpr_{n}") for n in lengths],
            f"{row['latency_single_ms']:.1f}, {row['latency_batched_ms']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    first = table.row(0, named=True)
    notes = [
        f"n: in-distribution {first['in_dist_n']} (production: its pooled test documents), over-defense "
        f"{first['overdefense_n']}, benign tool outputs {first['deployment_n']}, buried pairs "
        + ", ".join(f"{first[f'buried_n_{n}']} at {n}" for n in lengths)
        + "; 95 % intervals: bootstrap (AUROC stratified, buried by pair), Wilson for rates.",
        "op. = the operating threshold each detector ships with (0.5; the production detector's 0.5 is calibrated "
        "to 1 % FPR on benign tool outputs of its calibration split).",
    ]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def _auroc_cell(row: Mapping[str, object]) -> str:
    return (
        f"{float(row['lodo_worst_auroc']):.3f} [{float(row['lodo_worst_ci_low']):.3f}, "  # type: ignore[arg-type]
        f"{float(row['lodo_worst_ci_high']):.3f}]"  # type: ignore[arg-type]
    )


GERMAN_MARKERS = frozenset(
    "und der die das nicht ist ich du sie wir ein eine einen zu mit auf für von dem den des im sind bitte wie was "
    "warum wer auch oder aber vergiss ignoriere alle alles vorherigen anweisungen".split()
)
ENGLISH_MARKERS = frozenset(
    "the and is are you your not to of in for with on what how why who this that please all previous "
    "instructions ignore forget".split()
)


def language_of(text: str) -> str:
    """'de' or 'en' by which marker words are more frequent (ties and texts with neither: 'other').

    A crude tag, enough to split deepset (English and German) by language; the encoder is English-only
    (all-MiniLM-L6-v2), so German results say how far an English model carries, nothing more."""
    words = [w.strip(".,!?;:\"'()").lower() for w in text.split()]
    de = sum(w in GERMAN_MARKERS for w in words)
    en = sum(w in ENGLISH_MARKERS for w in words)
    return "de" if de > en else "en" if en > de else "other"


def language_table(
    detectors: Mapping[str, InjectionDetector], frame: pl.DataFrame, n_resamples: int = 1000
) -> pl.DataFrame:
    """AUROC (95 % CI) and F1 at 0.5 per detector and language tag on a labelled frame (text, label)."""
    from sklearn.metrics import f1_score, roc_auc_score

    tagged = frame.with_columns(language=pl.col("text").map_elements(language_of, return_dtype=pl.String))
    rows = []
    for key, detector in detectors.items():
        scores_all = detector.score(tagged["text"].to_list())
        for language in ("en", "de"):
            mask = (tagged["language"] == language).to_numpy()
            y = tagged["label"].to_numpy().astype(np.int64)[mask]
            if len(set(y.tolist())) < 2:
                continue
            scores = scores_all[mask]
            low, high = bootstrap_auroc(y, scores, n_resamples)
            rows.append(
                {
                    "detector": key,
                    "language": language,
                    "n": int(y.size),
                    "n_positive": int(y.sum()),
                    "auroc": float(roc_auc_score(y, scores)),
                    "auroc_ci_low": low,
                    "auroc_ci_high": high,
                    "f1": float(f1_score(y, scores >= DEFAULT_THRESHOLD, zero_division=0)),
                }
            )
    return pl.DataFrame(rows)
