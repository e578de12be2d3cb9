"""The data catalog: load configs/datasets.yaml, read a data set from a source, check its counts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from rvu_pipelines.config import load_yaml_config
from rvu_pipelines.data.parsers import PARSERS
from rvu_pipelines.data.sources import DatasetSource, ResolvedFiles
from rvu_pipelines.data.specs import DatasetCatalog, DatasetSpec
from rvu_pipelines.paths import config_dir


def load_catalog(path: Path | None = None) -> DatasetCatalog:
    catalog = load_yaml_config(path or config_dir() / "datasets.yaml", DatasetCatalog)
    unknown = sorted(set(catalog.datasets) - set(PARSERS))
    if unknown:
        from rvu_pipelines.errors import ConfigError

        raise ConfigError(f"datasets.yaml names data sets with no parser: {unknown}. Allowed values: {sorted(PARSERS)}")
    return catalog


@dataclass(frozen=True)
class LoadedDataset:
    spec: DatasetSpec
    frame: pl.DataFrame
    resolved: ResolvedFiles


def load_dataset(spec: DatasetSpec, source: DatasetSource) -> LoadedDataset:
    resolved = source.resolve(spec)
    frame = PARSERS[spec.name](resolved.files)
    return LoadedDataset(spec, frame, resolved)


@dataclass(frozen=True)
class CountMismatch:
    what: str
    expected: int
    actual: int

    def __str__(self) -> str:
        return f"{self.what}: expected {self.expected}, got {self.actual}"


def observed_group_counts(frame: pl.DataFrame, by: list[str]) -> dict[str, int]:
    grouped = frame.group_by(by).len().sort(by)
    return {"/".join(str(row[c]) for c in by): int(row["len"]) for row in grouped.iter_rows(named=True)}


def check_counts(spec: DatasetSpec, frame: pl.DataFrame) -> list[CountMismatch]:
    """Every published count that the frame does not reproduce (empty list = all match)."""
    problems = []
    if frame.height != spec.rows:
        problems.append(CountMismatch("rows", spec.rows, frame.height))
    for group in spec.group_counts:
        observed = observed_group_counts(frame, group.by)
        for key in sorted(set(group.counts) | set(observed)):
            expected, actual = group.counts.get(key, 0), observed.get(key, 0)
            if expected != actual:
                problems.append(CountMismatch(f"rows with {'/'.join(group.by)}={key}", expected, actual))
    for column, expected in spec.distinct_counts.items():
        actual = frame.get_column(column).n_unique()
        if actual != expected:
            problems.append(CountMismatch(f"distinct {column}", expected, actual))
    return problems
