"""Seed 002 Tables 1-3: D1-D5 on one corpus's test split, with CIs, latency, training time and a ROC image.

D2 and D4 come in already trained (the Dagster assets load them from the MLflow registry by name);
D1 needs no training, D3 is zero-shot, D5 is the paper's 0.4/0.6 ensemble of the D2 and D4 given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from rvu_pipelines.detectors.base import InjectionDetector
from rvu_pipelines.detectors.corpora import Corpus, stratified_subsample
from rvu_pipelines.detectors.ensemble import seed_ensemble
from rvu_pipelines.detectors.heuristic import HeuristicDetector
from rvu_pipelines.detectors.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    DetectorResult,
    evaluate_detector,
    plot_roc,
    results_table,
    table_markdown,
)

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
