"""Seed 002 Tables 1-3: D1-D5 on one corpus's test split, with CIs, latency, training time and a ROC image;
and the leave-one-dataset-out table: D2-D5 trained on one data set, tested on another.

D2 and D4 come in already trained (the Dagster assets load them from the MLflow registry by name);
D1 needs no training, D3 is zero-shot, D5 is the paper's 0.4/0.6 ensemble of the D2 and D4 given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from rvu_pipelines.detectors.base import InjectionDetector
from rvu_pipelines.detectors.corpora import Corpus, stratified_subsample
from rvu_pipelines.detectors.ensemble import SEED_WEIGHTS, combine, seed_ensemble
from rvu_pipelines.detectors.heuristic import HeuristicDetector
from rvu_pipelines.detectors.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    METRICS,
    DetectorResult,
    bootstrap_cis,
    evaluate_detector,
    plot_roc,
    point_metrics,
    results_table,
    table_markdown,
)
from rvu_pipelines.detectors.near_duplicates import cross_pairs
from rvu_pipelines.errors import DetectorError

ORDER = ("D1", "D2", "D3", "D4", "D5")


@dataclass
class CorpusEvaluation:
    """The table (one row per detector), its markdown, the ROC image and the raw results."""

    corpus: str
    table: pl.DataFrame
    markdown: str
    roc_path: Path
    results: dict[str, DetectorResult] = field(repr=False)
    n_test: int = 0

    def metrics(self) -> dict[str, float]:
        """Flat MLflow metrics: d4_f1, d4_f1_ci_low, d4_latency_batched_ms, ..."""
        out: dict[str, float] = {"n_test": float(self.n_test)}
        for key, result in self.results.items():
            prefix = key.lower()
            for metric, value in result.metrics.items():
                out[f"{prefix}_{metric}"] = value
                out[f"{prefix}_{metric}_ci_low"], out[f"{prefix}_{metric}_ci_high"] = result.cis[metric]
            out[f"{prefix}_latency_single_ms"] = result.latency.single_ms
            out[f"{prefix}_latency_batched_ms"] = result.latency.batched_ms
            if result.train_seconds is not None:
                out[f"{prefix}_train_s"] = result.train_seconds
        return out


def held_out_sample(
    corpus: Corpus, max_test: int | None = None, seed: int = BOOTSTRAP_SEED
) -> tuple[list[str], np.ndarray]:
    """The test split, or a stratified subsample of ``max_test`` rows (quick runs, tests); order by id."""
    part = stratified_subsample(corpus.part("test"), max_test, seed=seed)
    return part["text"].to_list(), part["label"].to_numpy().astype(np.int64)


def evaluate_corpus(
    corpus: Corpus,
    *,
    d2: InjectionDetector,
    d4: InjectionDetector,
    d3: InjectionDetector,
    roc_path: Path,
    train_seconds: Mapping[str, float] | None = None,
    notes: Mapping[str, str] | None = None,
    max_test: int | None = None,
    n_single: int = 20,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> CorpusEvaluation:
    """Evaluate D1-D5 on ``corpus``'s test split (each scored once in a batch, ``n_single`` texts one by one)."""
    texts, y = held_out_sample(corpus, max_test, seed)
    train_seconds, notes = dict(train_seconds or {}), dict(notes or {})
    detectors: dict[str, InjectionDetector] = {
        "D1": HeuristicDetector(),
        "D2": d2,
        "D3": d3,
        "D4": d4,
        "D5": seed_ensemble(d2, d4),
    }
    if "D2" in train_seconds and "D4" in train_seconds:
        train_seconds.setdefault("D5", train_seconds["D2"] + train_seconds["D4"])
    results = {}
    for key in ORDER:
        result = evaluate_detector(
            detectors[key],
            texts,
            y,
            n_single=n_single,
            n_resamples=n_resamples,
            seed=seed,
            train_seconds=train_seconds.get(key),
            note=notes.get(key, ""),
        )
        result.detector = _label(key, detectors[key])
        results[key] = result
    table = results_table(corpus.name, y, list(results.values()))
    roc = plot_roc(
        {r.detector: (y, r.scores) for r in results.values()},
        roc_path,
        f"ROC, {corpus.name} test (n={len(y)}, {int(y.sum())} positive)",
    )
    return CorpusEvaluation(corpus.name, table, table_markdown(table), roc, results, len(y))


def _label(key: str, detector: InjectionDetector) -> str:
    name = detector.name
    return name if name.startswith(key) else f"{key} {name}"


# ---------------------------------------------------------------- leave one data set out

# The data sets with both labels: TrustAIRLab has only jailbreaks and awesome-chatgpt-prompts only benign
# prompts, so they are one data set together (the 'jailbreak' corpus); 'combined' is their union with deepset.
LODO_DATASETS: tuple[str, ...] = ("deepset", "jailbreak")
LODO_DETECTORS: tuple[str, ...] = ("D2", "D3", "D4", "D5")
ZERO_SHOT = "none (zero-shot)"
LODO_COLUMNS: dict[str, pl.DataType] = {
    "detector": pl.String(),
    "train": pl.String(),
    "test": pl.String(),
    "n_train": pl.Int64(),
    "n_test": pl.Int64(),
    "n_positive": pl.Int64(),
    "test_twins_dropped": pl.Int64(),
    **{name: pl.Float64() for m in METRICS for name in (m, f"{m}_ci_low", f"{m}_ci_high")},
    "train_s": pl.Float64(),
}


@dataclass(frozen=True)
class LodoSettings:
    """How much to train and test on. ``quick()`` is the smoke setting (seconds, like the detector tests)."""

    max_train: int | None = None  # stratified subsample of each training split; None = all of it
    max_test: int | None = None  # stratified subsample of each test split; None = all of it
    d4_overrides: Mapping[str, object] = field(default_factory=dict)  # on top of settings_for(train corpus)
    n_resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = BOOTSTRAP_SEED

    @classmethod
    def quick(cls) -> LodoSettings:
        return cls(max_train=48, max_test=40, d4_overrides={"epochs": 1, "max_length": 64}, n_resamples=100)


@dataclass
class TransferEvaluation:
    """Long table (one row per detector x train data set x test data set) and its F1 matrix in markdown."""

    table: pl.DataFrame
    markdown: str

    def metrics(self) -> dict[str, float]:
        """Flat MLflow metrics: d2_deepset_to_jailbreak_f1, ..._f1_ci_low, ..._auroc, ..."""
        out: dict[str, float] = {}
        for row in self.table.iter_rows(named=True):
            train = "zero_shot" if row["train"] == ZERO_SHOT else row["train"]  # MLflow names: no parentheses
            prefix = f"{row['detector'].lower()}_{train}_to_{row['test']}"
            for m in ("f1", "auroc"):
                out[f"{prefix}_{m}"] = row[m]
                out[f"{prefix}_{m}_ci_low"], out[f"{prefix}_{m}_ci_high"] = row[f"{m}_ci_low"], row[f"{m}_ci_high"]
            out[f"{prefix}_n_test"] = float(row["n_test"])
        return out


TrainedModels = Mapping[str, tuple[InjectionDetector, InjectionDetector]]  # train data set -> (D2, D4)


def train_transfer_models(
    corpus: Corpus, settings: LodoSettings, *, with_d4: bool = True, encoder: object | None = None
) -> tuple[InjectionDetector, InjectionDetector | None, dict[str, float]]:
    """D2 (and D4) trained on ``corpus``'s training split (subsampled per ``settings``); fit seconds per model."""
    from rvu_pipelines.detectors.finetune import finetune, resolve_encoder, settings_for
    from rvu_pipelines.detectors.tfidf import TfidfDetector

    train = stratified_subsample(corpus.part("train"), settings.max_train)
    texts, y = train["text"].to_list(), train["label"].to_numpy()
    d2 = TfidfDetector.train(texts, y)
    seconds = {"D2": float(d2.fit_seconds or 0.0)}
    if not with_d4:
        return d2, None, seconds
    d4, report = finetune(
        texts,
        y,
        encoder=encoder or resolve_encoder(),  # type: ignore[arg-type]
        settings=settings_for(corpus.name, **dict(settings.d4_overrides)),
        progress=False,
    )
    seconds["D4"] = float(report.wall_seconds)
    return d2, d4, seconds


def leave_one_dataset_out(
    corpora: Mapping[str, Corpus],
    *,
    d3: InjectionDetector | None = None,
    models: TrainedModels | None = None,
    detectors: Sequence[str] = LODO_DETECTORS,
    settings: LodoSettings | None = None,
    datasets: Sequence[str] = LODO_DATASETS,
    train_seconds: Mapping[str, Mapping[str, float]] | None = None,
    encoder: object | None = None,
    log: Callable[[str], None] | None = None,
) -> TransferEvaluation:
    """D2-D5 trained on each data set's training split, tested on every data set's test split.

    The off-diagonal cells are the honest generalisation figure (a new source of prompts); the diagonal
    is the in-domain reference (the main table's split). ``models`` gives trained (D2, D4) per training
    data set, e.g. the registered ones; those missing are trained here (``settings``: ``LodoSettings.quick()``
    for a smoke run; ``encoder``: D4's base encoder, default the model store's). Test texts with a
    near-duplicate (Jaccard >= 0.5, word 5-grams) in the training split are dropped and counted
    (``test_twins_dropped``; 0 on the diagonal, whose split is by cluster). ``n_train`` is null for given
    models and for D3.
    D3 is zero-shot: its rows only change with the test set. D5 is 0.4 x D2 + 0.6 x D4 on the same scores.
    """
    settings = settings or LodoSettings()
    unknown = sorted(set(detectors) - set(LODO_DETECTORS))
    if unknown:
        raise DetectorError(
            f"Unknown detectors {unknown} for leave-one-dataset-out. Allowed: {', '.join(LODO_DETECTORS)}"
        )
    missing = [d for d in datasets if d not in corpora]
    if missing or len(datasets) < 2:
        raise DetectorError(f"Leave-one-dataset-out needs at least two corpora; missing {missing} of {list(datasets)}.")
    if "D3" in detectors and d3 is None:
        raise DetectorError("D3 is in the table but no pretrained detector was given (d3=...).")
    need_d4 = any(d in detectors for d in ("D4", "D5"))
    say = log or (lambda _message: None)
    rows: list[dict[str, object]] = []
    d3_cache: dict[str, float] = {}  # zero-shot: each text is scored once
    for source in datasets:
        seconds = dict((train_seconds or {}).get(source, {}))
        given = bool(models and source in models)
        if models and source in models:
            d2, d4 = models[source]
        else:
            say(f"training D2{'/D4' if need_d4 else ''} on {source}")
            d2, maybe_d4, seconds = train_transfer_models(corpora[source], settings, with_d4=need_d4, encoder=encoder)
            d4 = maybe_d4 if maybe_d4 is not None else d2  # unused without D4/D5
        train_texts = stratified_subsample(corpora[source].part("train"), settings.max_train)["text"].to_list()
        n_train = None if given else len(train_texts)  # given models: their own record says what they saw
        for target in datasets:
            test = stratified_subsample(corpora[target].part("test"), settings.max_test, seed=settings.seed)
            twins = {int(j) for _, j in cross_pairs(train_texts, test["text"].to_list()).tolist()}
            keep = np.array([i not in twins for i in range(test.height)], dtype=bool)
            texts = [t for t, k in zip(test["text"].to_list(), keep, strict=True) if k]
            y = test["label"].to_numpy().astype(np.int64)[keep]
            start = time.perf_counter()
            scores: dict[str, np.ndarray] = {"D2": d2.score(texts)}
            if need_d4:
                scores["D4"] = d4.score(texts)
                scores["D5"] = combine([scores["D2"], scores["D4"]], SEED_WEIGHTS)
            if "D3" in detectors and d3 is not None:
                new = list(dict.fromkeys(t for t in texts if t not in d3_cache))
                if new:
                    d3_cache.update(zip(new, d3.score(new).tolist(), strict=True))
                scores["D3"] = np.array([d3_cache[t] for t in texts], dtype=np.float64)
            say(
                f"{source} -> {target}: {len(texts)} test texts ({len(twins)} twins dropped) scored in "
                f"{time.perf_counter() - start:.1f}s"
            )
            for key in LODO_DETECTORS:
                if key not in detectors:
                    continue
                point = point_metrics(y, scores[key])
                cis, _ = bootstrap_cis(y, scores[key], n_resamples=settings.n_resamples, seed=settings.seed)
                fit = seconds.get("D2", 0.0) + seconds.get("D4", 0.0) if key == "D5" else seconds.get(key)
                rows.append(
                    {
                        "detector": key,
                        "train": ZERO_SHOT if key == "D3" else source,
                        "test": target,
                        "n_train": None if key == "D3" else n_train,
                        "n_test": int(y.size),
                        "n_positive": int(y.sum()),
                        "test_twins_dropped": len(twins),
                        **{m: point[m] for m in METRICS},
                        **{f"{m}_{b}": cis[m][i] for m in METRICS for i, b in enumerate(("ci_low", "ci_high"))},
                        "train_s": None if key == "D3" else fit,
                    }
                )
    table = pl.DataFrame(rows, schema=LODO_COLUMNS)
    if "D3" in detectors:  # zero-shot: one row per test set (the first training set's test sample)
        table = table.unique(subset=["detector", "train", "test"], keep="first", maintain_order=True)
    return TransferEvaluation(table, transfer_markdown(table, datasets))


def transfer_markdown(table: pl.DataFrame, datasets: Sequence[str] = LODO_DATASETS) -> str:
    """F1 [95% CI] per detector (rows) and train -> test pair (columns), off-diagonal pairs first."""
    pairs = [(a, b) for a in datasets for b in datasets if a != b] + [(a, a) for a in datasets]
    header = ["Detector", *[f"{a} → {b}" + (" (in-domain)" if a == b else "") for a, b in pairs]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for detector in dict.fromkeys(table["detector"].to_list()):
        cells = [detector]
        for a, b in pairs:
            match = table.filter(
                (pl.col("detector") == detector)
                & (pl.col("test") == b)
                & ((pl.col("train") == a) | (pl.col("train") == ZERO_SHOT))
            )
            if match.is_empty():
                cells.append("")
                continue
            row = match.row(0, named=True)
            cells.append(f"{row['f1'] * 100:.2f} [{row['f1_ci_low'] * 100:.1f}, {row['f1_ci_high'] * 100:.1f}]")
        lines.append("| " + " | ".join(cells) + " |")
    sizes: dict[tuple[str, str], tuple[int, int]] = {}
    for row in table.iter_rows(named=True):
        sizes.setdefault((row["train"], row["test"]), (row["n_test"], row["test_twins_dropped"]))
    notes = [
        f"{a} → {b}: n_test {sizes[(a, b)][0]}, {sizes[(a, b)][1]} test texts with a training near-twin dropped"
        for a, b in pairs
        if (a, b) in sizes
    ]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes] + ["- D3 is zero-shot (no training data)."])
