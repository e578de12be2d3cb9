"""The kill-switch study: features from one forward pass per example, per-layer held-out AUROC,
calibration on 20 / 50 / 200 examples, and the histograms that show whether the seed's regimes appear."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np
import polars as pl

from rvu_pipelines.spectral.config import DEFAULT_GRAPH_CONFIG, GRAPH_CONFIGS, GraphConfig, graph_config
from rvu_pipelines.spectral.errors import CalibrationError, ContextLengthError
from rvu_pipelines.spectral.graph import STAT_NAMES
from rvu_pipelines.spectral.killswitch import calibrate, evaluate, orientation_and_auroc, stratified_draw
from rvu_pipelines.spectral.model import SpectralModel, head_stats_from_trace, layer_stats_from_trace
from rvu_pipelines.spectral.records import NpzRecord
from rvu_pipelines.spectral.uncertainty import Estimate, auroc_estimate

DEFAULT_MAX_TOKENS = 384
CALIBRATION_SIZES: tuple[int, ...] = (20, 50, 200)


@dataclass
class FeatureSet(NpzRecord):
    """Statistics per example, layer and statistic (``STAT_NAMES`` order), for the examples kept."""

    _npz_skip: ClassVar[tuple[str, ...]] = ("settings",)
    _npz_keys: ClassVar[dict[str, str]] = {"seconds_per_example": "seconds"}

    name: str
    values: np.ndarray  # (examples, layers, statistics)
    labels: np.ndarray
    splits: np.ndarray
    sources: np.ndarray
    n_tokens: np.ndarray
    skipped: int = 0
    seconds_per_example: float = 0.0
    settings: dict[str, object] = field(default_factory=dict)
    groups: np.ndarray | None = None  # the pair / triple each example belongs to
    roles: np.ndarray | None = None  # "clean" | "injected" | "padded" where the examples carry a role
    head_values: np.ndarray | None = None  # (examples, head layers, heads, statistics): per-head graphs

    def part(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        mask = self.splits == split
        return self.values[mask], self.labels[mask]


def resolve_graph(graph: str | GraphConfig) -> tuple[str, GraphConfig]:
    """A configuration's name and value from either (a ``GraphConfig`` not in the registry is ``custom``)."""
    if isinstance(graph, GraphConfig):
        named = [name for name, value in GRAPH_CONFIGS.items() if value == graph]
        return (named[0] if named else "custom"), graph
    return graph, graph_config(graph)


def extract_features(
    model: SpectralModel,
    examples: pl.DataFrame,
    *,
    name: str = "examples",
    scopes: Sequence[str] = ("text",),
    max_tokens: int = DEFAULT_MAX_TOKENS,
    graph: str | GraphConfig = DEFAULT_GRAPH_CONFIG,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, FeatureSet]:
    """One forward pass per example, statistics per scope: ``text`` (the whole token graph) and/or
    ``document`` (the induced subgraph of the statement / document tokens), on the named graph
    configuration (``config.GRAPH_CONFIGS``). Examples longer than ``max_tokens`` are skipped and counted
    (the eigendecomposition is O(N³))."""
    by_graph = extract_by_graph(model, examples, [graph], name=name, scopes=scopes, max_tokens=max_tokens,
                                progress=progress)  # fmt: skip
    return {scope: by_graph[(scope, resolve_graph(graph)[0])] for scope in scopes}


def extract_by_graph(
    model: SpectralModel,
    examples: pl.DataFrame,
    graphs: Sequence[str | GraphConfig],
    *,
    name: str = "examples",
    scopes: Sequence[str] = ("text",),
    max_tokens: int = DEFAULT_MAX_TOKENS,
    head_layers: Sequence[int] = (),
    progress: Callable[[int, int], None] | None = None,
) -> dict[tuple[str, str], FeatureSet]:
    """Like ``extract_features`` for several graph configurations from the same forward pass, keyed
    ``(scope, graph name)``; ``head_layers``: also every head's own graph at those layers (the first
    configuration's sinks and signal), for a probe over per-head features."""
    bad = [scope for scope in scopes if scope not in ("text", "document")]
    if bad or not scopes:
        raise ValueError(f"scopes must be 'text' and/or 'document', got {list(scopes)}")
    resolved = [resolve_graph(graph) for graph in graphs]
    if not resolved:
        raise ValueError("graphs names no configuration; allowed: " + ", ".join(GRAPH_CONFIGS))
    keys = [(scope, graph_name) for scope in scopes for graph_name, _ in resolved]
    rows: dict[tuple[str, str], list] = {key: [] for key in keys}
    heads: dict[str, list] = {scope: [] for scope in scopes}
    labels, splits, sources, lengths, groups, roles = [], [], [], [], [], []
    has_roles = "role" in examples.columns
    skipped = 0
    started = time.perf_counter()
    for number, row in enumerate(examples.iter_rows(named=True)):
        if progress is not None:
            progress(number, examples.height)
        text = row["text"]
        n = int(model.tokenize(text)["input_ids"].shape[1])
        if n > max_tokens:
            skipped += 1
            continue
        try:
            trace = model.forward(text)
        except ContextLengthError:
            skipped += 1
            continue
        for scope in scopes:
            token_slice = model.token_slice(text, row["doc_start"], row["doc_end"]) if scope == "document" else None
            for graph_name, config in resolved:
                stats = layer_stats_from_trace(trace, token_slice=token_slice, config=config)
                rows[(scope, graph_name)].append([[getattr(stats[k], s) for s in STAT_NAMES] for k in sorted(stats)])
            if head_layers:
                heads[scope].append(
                    head_stats_from_trace(trace, list(head_layers), config=resolved[0][1], token_slice=token_slice)
                )
        labels.append(int(row["label"]))
        splits.append(row["split"])
        sources.append(row["source"])
        lengths.append(n)
        groups.append(str(row.get("group", "")))
        roles.append(str(row["role"]) if has_roles else ("injected" if int(row["label"]) else "clean"))
    elapsed = time.perf_counter() - started
    out = {}
    for scope, graph_name in keys:
        config = dict(resolved)[graph_name]
        out[(scope, graph_name)] = FeatureSet(
            name=name,
            values=np.asarray(rows[(scope, graph_name)], dtype=np.float64).reshape(
                len(labels), model.n_layers, len(STAT_NAMES)
            ),
            labels=np.asarray(labels, dtype=np.int64),
            splits=np.asarray(splits, dtype=str),
            sources=np.asarray(sources, dtype=str),
            n_tokens=np.asarray(lengths, dtype=np.int64),
            skipped=skipped,
            seconds_per_example=elapsed / max(len(labels), 1),
            settings={"scope": scope, "max_tokens": max_tokens, "graph": graph_name, "config": asdict(config)},
            groups=np.asarray(groups, dtype=str),
            roles=np.asarray(roles, dtype=str),
            head_values=np.asarray(heads[scope], dtype=np.float64) if head_layers else None,
        )
    return out


def per_layer_auroc(values: np.ndarray, labels: np.ndarray, statistic: str = "hfer") -> list[dict[str, object]]:
    """Held-out AUROC per layer for one statistic, oriented so that 0.5 is chance and 1 perfect.

    The direction is the one that makes the firing class higher *on these examples*: an optimistic,
    label-peeking orientation reported as such (``calibrated_direction`` in the calibration table is not)."""
    index = STAT_NAMES.index(statistic)
    out = []
    for layer in range(values.shape[1]):
        column = values[:, layer, index]
        direction, _ = orientation_and_auroc(column, labels)
        estimate = auroc_estimate(labels, direction * column)
        out.append(
            {
                "layer": layer,
                "statistic": statistic,
                "direction": direction,
                "auroc": estimate.value,
                "low": estimate.low,
                "high": estimate.high,
                "n": estimate.n,
                "mean_fire": float(column[labels == 1].mean()),
                "mean_pass": float(column[labels == 0].mean()),
            }
        )
    return out


def best_heldout(values: np.ndarray, labels: np.ndarray) -> dict[str, object]:
    rows = [row for s in STAT_NAMES for row in per_layer_auroc(values, labels, s)]
    return max(rows, key=lambda r: float(r["auroc"]))  # type: ignore[arg-type]


def calibration_comparison(
    features: FeatureSet,
    sizes: Sequence[int] = CALIBRATION_SIZES,
    draws: int = 20,
    layers: Sequence[int] | None = None,
) -> pl.DataFrame:
    """For each calibration size, ``draws`` stratified draws from the calibration split; each calibrates a
    switch (layer, statistic, threshold) and is evaluated on the whole held-out split."""
    cal_x, cal_y = features.part("calibration")
    held_x, held_y = features.part("heldout")
    rows = []
    for size in sizes:
        effective = min(size, cal_y.size)
        for draw in range(draws):
            try:
                chosen = stratified_draw(cal_y, effective, seed=1000 * size + draw)
                switch = calibrate(cal_x[chosen], cal_y[chosen], layers=layers, seed=draw)
            except CalibrationError:
                continue
            result = evaluate(switch, held_x, held_y, resamples=200, seed=draw)
            rows.append(
                {
                    "set": features.name,
                    "size": size,
                    "n_calibration": int(effective),
                    "draw": draw,
                    "layer": switch.layer,
                    "statistic": switch.statistic,
                    "threshold": switch.threshold,
                    "calibration_auroc": switch.calibration_auroc,
                    "heldout_auroc": result.auroc.value,
                    "tpr": result.tpr.value,
                    "fpr": result.fpr.value,
                    "accuracy": result.accuracy.value,
                    "n_heldout": int(held_y.size),
                }
            )
        if effective < size:
            break  # larger sizes would repeat the same whole-pool calibration
    return pl.DataFrame(rows)


def summarise_calibration(table: pl.DataFrame) -> pl.DataFrame:
    """Mean and spread over draws per calibration size."""
    return (
        table.group_by(["set", "size", "n_calibration"])
        .agg(
            pl.len().alias("draws"),
            pl.col("heldout_auroc").mean().alias("auroc_mean"),
            pl.col("heldout_auroc").quantile(0.05).alias("auroc_p05"),
            pl.col("heldout_auroc").quantile(0.95).alias("auroc_p95"),
            pl.col("tpr").mean().alias("tpr_mean"),
            pl.col("fpr").mean().alias("fpr_mean"),
            pl.col("accuracy").mean().alias("accuracy_mean"),
            pl.col("layer").mode().first().alias("layer_mode"),
            pl.col("statistic").mode().first().alias("statistic_mode"),
        )
        .sort(["set", "size"])
    )


def heldout_estimate(features: FeatureSet, layer: int, statistic: str, direction: float) -> Estimate:
    values, labels = features.part("heldout")
    return auroc_estimate(labels, direction * values[:, layer, STAT_NAMES.index(statistic)])


def limit_groups(frame: pl.DataFrame, limit: int, seed: int = 0) -> pl.DataFrame:
    """At most ``limit`` examples, whole groups (pairs) at a time, in a seeded random group order."""
    if frame.height <= limit:
        return frame
    groups = frame["group"].unique(maintain_order=True).to_list()
    order = np.random.default_rng(seed).permutation(len(groups))
    sizes = frame.group_by("group").len()
    size_of = dict(zip(sizes["group"].to_list(), sizes["len"].to_list(), strict=True))
    kept, total = [], 0
    for i in order:
        group = groups[i]
        if total + size_of[group] > limit:
            continue
        kept.append(group)
        total += size_of[group]
    return frame.filter(pl.col("group").is_in(kept))


@dataclass(frozen=True)
class SampledResult:
    """One evaluation set's sampled study: the switch calibrated on its calibration part, held-out numbers."""

    name: str
    n_calibration: int
    n_heldout: int
    switch: dict[str, object]
    heldout: dict[str, dict[str, float | int]]
    hfer_by_layer: list[dict[str, Any]]
    statistic_ms_per_layer: float
    seconds_per_example: float
    graph: str = DEFAULT_GRAPH_CONFIG

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def sampled_study(
    model: SpectralModel,
    sets: dict[str, pl.DataFrame],
    per_set: int = 24,
    seed: int = 0,
    *,
    graph: str = DEFAULT_GRAPH_CONFIG,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> dict[str, SampledResult]:
    """The study on a few whole pairs per set (an asset's budget), with the full study's configuration: the
    same graph configuration and token limit, pairs kept whole through it; calibrate on the sample's
    calibration part, evaluate on its held-out part, and time the statistic alone per layer on the sample."""
    from rvu_pipelines.spectral.config import config_stats
    from rvu_pipelines.spectral.data import keep_whole_groups

    config = graph_config(graph)
    out: dict[str, SampledResult] = {}
    for name, frame in sets.items():
        fitting = keep_whole_groups(frame, lambda text: len(model.tokenizer(text)["input_ids"]), max_tokens)
        calibration = limit_groups(fitting.filter(pl.col("split") == "calibration"), per_set // 2, seed)
        heldout = limit_groups(fitting.filter(pl.col("split") == "heldout"), per_set - per_set // 2, seed)
        features = extract_features(
            model, pl.concat([calibration, heldout]), name=name, graph=graph, max_tokens=max_tokens
        )["text"]
        cal_x, cal_y = features.part("calibration")
        held_x, held_y = features.part("heldout")
        switch = calibrate(cal_x, cal_y)
        result = evaluate(switch, held_x, held_y, resamples=200)
        trace = model.forward(calibration["text"][0])
        started = time.perf_counter()
        for layer in range(trace.n_layers):
            config_stats(trace.attentions[layer], trace.hidden_states[layer], config)
        ms = (time.perf_counter() - started) * 1000.0 / trace.n_layers
        out[name] = SampledResult(
            name=name,
            n_calibration=int(cal_y.size),
            n_heldout=int(held_y.size),
            switch=switch.as_dict(),
            heldout=result.as_dict(),
            hfer_by_layer=per_layer_auroc(held_x, held_y, "hfer"),
            statistic_ms_per_layer=ms,
            seconds_per_example=features.seconds_per_example,
            graph=graph,
        )
    return out
