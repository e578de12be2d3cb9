"""Golden-result regression for the attack table: what moved, by how much, against which tolerance.

The golden file is committed (configs/golden/table1_<profile>.json); the nightly schedule and
``rvu regress`` both call :func:`compare_to_golden`, so the UI check and the CLI never disagree.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import config_dir

METRICS = ("asr", "utility")


@dataclass(frozen=True)
class Tolerance:
    asr: float = 0.10
    utility: float = 0.10

    def of(self, metric: str) -> float:
        return float(getattr(self, metric))


@dataclass(frozen=True)
class Drift:
    """One cell metric outside its tolerance (or a cell missing on one side)."""

    cell: str
    metric: str
    golden: float | None
    current: float | None
    delta: float | None
    tolerance: float


def load_tolerance(path: Path | None = None) -> Tolerance:
    path = Path(path) if path else config_dir() / "regression.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(
            f"Regression config {path} is missing; it needs `tolerance: {{asr: 0.1, utility: 0.1}}`."
        ) from None
    values = raw.get("tolerance", {})
    unknown = sorted(set(values) - set(METRICS))
    if unknown:
        raise ConfigError(
            f"Invalid config {path}: unknown key(s) tolerance.{', tolerance.'.join(unknown)}; "
            f"allowed: {', '.join(METRICS)}."
        )
    for key, value in values.items():
        if not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ConfigError(
                f"Invalid config {path}: tolerance.{key} = {value!r}; allowed values: a number in [0, 1]."
            )
    return Tolerance(**{k: float(v) for k, v in values.items()})


def golden_path(profile: str) -> Path:
    return config_dir() / "golden" / f"table1_{profile}.json"


def _cells(table: pl.DataFrame) -> dict[str, dict[str, float]]:
    cells = {}
    for row in table.iter_rows(named=True):
        cells[f"{row['benchmark']}/{row['defense']}"] = {"n": int(row["n"]), **{m: float(row[m]) for m in METRICS}}
    return dict(sorted(cells.items()))


def golden_document(table: pl.DataFrame, profile: str, model_id: str) -> dict[str, Any]:
    return {"profile": profile, "model_sha256": model_id, "cells": _cells(table)}


def write_golden(table: pl.DataFrame, profile: str, model_id: str, path: Path | None = None) -> Path:
    path = Path(path) if path else golden_path(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(golden_document(table, profile, model_id), indent=2, sort_keys=True) + "\n")
    return path


def load_golden(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"No golden results at {path}: run `rvu regress --update-golden` once on a trusted "
            "checkout and commit the file."
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Golden file {path} is not valid JSON (line {exc.lineno}): {exc.msg}.") from None
    if not isinstance(document.get("cells"), dict):
        raise ConfigError(
            f"Golden file {path} has no `cells` object; regenerate it with `rvu regress --update-golden`."
        )
    return document


def compare_to_golden(table: pl.DataFrame, golden: dict[str, Any], tolerance: Tolerance) -> list[Drift]:
    """Every metric of every cell that moved beyond tolerance; cells on one side only are drifts too."""
    current, expected = _cells(table), golden["cells"]
    drifts = []
    for cell in sorted(set(current) | set(expected)):
        for metric in METRICS:
            now = current.get(cell, {}).get(metric)
            then = expected.get(cell, {}).get(metric)
            if now is None or then is None:
                drifts.append(Drift(cell, metric, then, now, None, tolerance.of(metric)))
                continue
            delta = now - then
            if abs(delta) > tolerance.of(metric) + 1e-9:
                drifts.append(Drift(cell, metric, then, now, round(delta, 6), tolerance.of(metric)))
    return drifts


def drift_markdown(drifts: list[Drift]) -> str:
    if not drifts:
        return "No cell moved beyond tolerance."
    lines = ["| cell | metric | golden | now | delta | tolerance |", "|---|---|---|---|---|---|"]
    for d in drifts:
        fmt = lambda v: "missing" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(
            f"| {d.cell} | {d.metric} | {fmt(d.golden)} | {fmt(d.current)} | {fmt(d.delta)} | {d.tolerance:.2f} |"
        )
    return "\n".join(lines)


def drifts_as_dicts(drifts: list[Drift]) -> list[dict[str, Any]]:
    return [asdict(d) for d in drifts]
