"""Golden-result regression for the attack table: what moved, by how much, against which tolerance.

The golden file is committed (configs/golden/table1_<profile>.json), one cell per
``benchmark/attack/defense``; the nightly schedule and
``rvu regress`` both run :func:`regression_sweep` (every episode re-run against the current code; the
LLM response cache still serves identical prompts) and call :func:`compare_to_golden`, so the UI check
and the CLI never disagree. Besides ASR and utility within tolerance, a cell must score the same number
of episodes (``n``, exact) with no more errored episodes than golden (``errors``, tolerance in
configs/regression.yaml, default 0): a defense that crashes on most episodes fails the check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import yaml

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import config_dir
from rvu_pipelines.scenarios.axes import CANONICAL, DEFENSES, NATIVE

if TYPE_CHECKING:  # annotations only: the harness imports the agent stack
    from rvu_pipelines.agents.evaluation import CellRun
    from rvu_pipelines.agents.harness import Harness
    from rvu_pipelines.scenarios.contract import Scenario

METRICS = ("asr", "utility")  # rates, compared within an absolute tolerance
COUNTS = ("n", "errors")  # episode counts: n exactly, errors at most golden's + tolerance.errors
TOLERANCE_KEYS = (*METRICS, "errors")


@dataclass(frozen=True)
class Tolerance:
    asr: float = 0.10
    utility: float = 0.10
    errors: int = 0  # errored episodes a cell may have beyond golden's

    def of(self, metric: str) -> float:
        return 0.0 if metric == "n" else float(getattr(self, metric))


@dataclass(frozen=True)
class Drift:
    """One cell count (n, errors) or metric (asr, utility) outside its tolerance, or a cell missing on one
    side (then every field of it is one Drift with ``None`` on the missing side)."""

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
            f"Regression config {path} is missing; it needs `tolerance: {{asr: 0.1, utility: 0.1, errors: 0}}`."
        ) from None
    values = raw.get("tolerance", {})
    unknown = sorted(set(values) - set(TOLERANCE_KEYS))
    if unknown:
        raise ConfigError(
            f"Invalid config {path}: unknown key(s) tolerance.{', tolerance.'.join(unknown)}; "
            f"allowed: {', '.join(TOLERANCE_KEYS)}."
        )
    for key, value in values.items():
        if key == "errors":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"Invalid config {path}: tolerance.errors = {value!r}; allowed values: an integer >= 0 "
                    "(errored episodes a cell may have beyond golden's)."
                )
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ConfigError(
                f"Invalid config {path}: tolerance.{key} = {value!r}; allowed values: a number in [0, 1]."
            )
    return Tolerance(
        asr=float(values.get("asr", Tolerance.asr)),
        utility=float(values.get("utility", Tolerance.utility)),
        errors=int(values.get("errors", Tolerance.errors)),
    )


def golden_path(profile: str) -> Path:
    return config_dir() / "golden" / f"table1_{profile}.json"


def golden_full_path(profile: str) -> Path:
    """The full attack table's golden cells (held-out samples of 100 per benchmark, several runs' cells)."""
    return config_dir() / "golden" / f"table1_full_{profile}.json"


def cell_key(benchmark: str, attack: str, defense: str) -> str:
    """A golden cell's name: ``benchmark/attack/defense``."""
    return f"{benchmark}/{attack}/{defense}"


def split_cell(cell: str) -> tuple[str, str, str]:
    """``benchmark/attack/defense`` -> its three names; any other shape is a golden file to regenerate."""
    parts = cell.split("/")
    if len(parts) != 3 or not all(parts):
        raise ConfigError(
            f"Golden cell {cell!r} is not benchmark/attack/defense; regenerate the file with "
            "`rvu regress --update-golden`."
        )
    return parts[0], parts[1], parts[2]


def _cells(table: pl.DataFrame) -> dict[str, dict[str, float | None]]:
    """cell -> n, errors (0 when the table has no such column), asr, utility; NaN rates become None. A table
    without an ``attack`` column holds native cells."""
    cells = {}
    for row in table.iter_rows(named=True):
        rates = {m: float(row[m]) if row.get(m) is not None else float("nan") for m in METRICS}
        cells[cell_key(row["benchmark"], row.get("attack") or NATIVE, row["defense"])] = {
            "n": int(row["n"]),
            "errors": int(row.get("errors") or 0),
            **{m: (None if math.isnan(v) else v) for m, v in rates.items()},
        }
    return dict(sorted(cells.items()))


def table_code_version(table: pl.DataFrame) -> str | None:
    """The code version the table's cells were computed with (several, comma-joined, if they differ)."""
    if "code_version" not in table.columns:
        return None
    versions = sorted({str(v) for v in table["code_version"].drop_nulls().to_list()})
    return ",".join(versions) or None


def golden_document(table: pl.DataFrame, profile: str, model_id: str) -> dict[str, Any]:
    document: dict[str, Any] = {"profile": profile, "model_sha256": model_id, "cells": _cells(table)}
    version = table_code_version(table)
    if version:
        document["code_version"] = version  # provenance only: never compared
    return document


def write_golden(
    table: pl.DataFrame,
    profile: str,
    model_id: str,
    path: Path | None = None,
    *,
    only: Sequence[str] | None = None,
    attacks: Sequence[str] | None = None,
) -> Path:
    """Write the table as the golden results. ``only`` (defenses) and/or ``attacks`` (default: the table's):
    replace or add just the cells of those defenses under those attacks and keep every other cell of the existing
    file as it is (a new defense's or attack's cells without re-running the others); the file must then exist and
    be for the same weights. Neither: the table replaces the whole file."""
    path = Path(path) if path else golden_path(profile)
    document = golden_document(table, profile, model_id)
    if only is not None or attacks is not None:
        document = merge_golden(load_golden(path), document, only, attacks)
    return save_golden(document, path)


def save_golden(document: dict[str, Any], path: Path) -> Path:
    """Write a golden document (sorted keys, one step: a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, json.dumps(document, indent=2, sort_keys=True) + "\n")


def union_golden(
    existing: dict[str, Any] | None, table: pl.DataFrame, profile: str, model_id: str
) -> tuple[dict[str, Any], list[str]]:
    """``existing`` (None: no file yet) with every cell of ``table`` added or replaced, every other cell kept: how
    the tables of several runs (each a few benchmarks, attacks and defenses) make up one golden file. Also the
    cells both held with other values (a run that does not reproduce an earlier one's cell), for the caller to
    report; the table's values win."""
    new = golden_document(table, profile, model_id)
    if existing is None:
        return new, []
    merged = merge_golden(existing, new, defenses=None, attacks=[])  # refuses other weights; keeps every cell
    changed = sorted(c for c, v in new["cells"].items() if c in merged["cells"] and merged["cells"][c] != v)
    merged["cells"] = dict(sorted({**merged["cells"], **new["cells"]}.items()))
    return merged, changed


def compare_golden_documents(made: dict[str, Any], golden: dict[str, Any], tolerance: Tolerance) -> list[Drift]:
    """A golden document made anew (``union_golden`` over runs' tables) against the committed one: every cell
    of either side, a cell on one side only a drift (one the runs no longer produce, or one the file lacks).
    Documents for other weights or another profile are not comparable and are refused."""
    ours, theirs = (made.get("profile"), made.get("model_sha256")), (golden.get("profile"), golden.get("model_sha256"))
    if ours != theirs:
        raise ConfigError(
            f"The runs are for profile {ours[0]!r} / weights {ours[1]}, the golden file for {theirs[0]!r} / "
            f"{theirs[1]}: run them with the file's model profile, or remake the file from these runs."
        )
    return _cell_drifts(made["cells"], golden["cells"], tolerance)


def _chosen(cell: str, defenses: Sequence[str] | None, attacks: Sequence[str] | None) -> bool:
    _, attack, defense = split_cell(cell)
    return (defenses is None or defense in defenses) and (attacks is None or attack in attacks)


def merge_golden(
    existing: dict[str, Any],
    new: dict[str, Any],
    defenses: Sequence[str] | None,
    attacks: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``existing`` with the cells of ``defenses`` (None: every one) under ``attacks`` (None: the attacks ``new``
    has cells of, so a run of some attacks never drops another attack's cells) taken from ``new``; the code
    versions of both are kept."""
    if existing.get("model_sha256") != new.get("model_sha256") or existing.get("profile") != new.get("profile"):
        raise ConfigError(
            f"The golden file is for profile {existing.get('profile')!r} / weights {existing.get('model_sha256')}, "
            f"the run for {new.get('profile')!r} / {new.get('model_sha256')}; update every cell instead "
            "(rvu regress --update-golden without --defense and --attack)."
        )
    if attacks is None:
        attacks = sorted({split_cell(cell)[1] for cell in new["cells"]})
    cells = {cell: values for cell, values in existing["cells"].items() if not _chosen(cell, defenses, attacks)}
    cells.update({cell: values for cell, values in new["cells"].items() if _chosen(cell, defenses, attacks)})
    merged = {**existing, "cells": dict(sorted(cells.items()))}
    versions = {v for d in (existing, new) for v in str(d.get("code_version") or "").split(",") if v}
    if versions:
        merged["code_version"] = ",".join(sorted(versions))  # provenance only: never compared
    return merged


def golden_subset(
    golden: dict[str, Any], defenses: Sequence[str] | None, attacks: Sequence[str] | None = None
) -> dict[str, Any]:
    """The golden document restricted to the cells of ``defenses`` under ``attacks`` (None: every one), what
    ``rvu regress --defense/--attack`` and a Table 1 of some attacks are compared with."""
    return {**golden, "cells": {c: v for c, v in golden["cells"].items() if _chosen(c, defenses, attacks)}}


@dataclass(frozen=True)
class GoldenComparison:
    """A run's table against the golden cells it can be held to."""

    drifts: list[Drift]
    compared: list[str]  # cells the run measured on a sample of the golden cell's size
    other_sample_size: list[str]  # cells it measured on another size: a different measurement, not a drift
    not_in_golden: list[str]  # cells the golden file does not hold yet


def compare_on_the_same_sample(table: pl.DataFrame, golden: dict[str, Any], tolerance: Tolerance) -> GoldenComparison:
    """Hold a run to the golden cells it ran on a sample of the same size (n + errors). A default run's five
    scenarios per benchmark against a published cell's 100 is another measurement, the golden's cells the run did
    not measure are not its, and its cells the golden lacks are new: none of them is a drift."""
    current = _cells(table)
    expected = golden["cells"]
    compared: list[str] = []
    other: list[str] = []
    for cell in sorted(set(current) & set(expected)):
        then = expected[cell]
        size = int(then.get("n") or 0) + int(then.get("errors") or 0)
        now = int(current[cell]["n"] or 0) + int(current[cell]["errors"] or 0)
        (compared if size == now else other).append(cell)
    drifts = _cell_drifts({c: current[c] for c in compared}, {c: expected[c] for c in compared}, tolerance)
    return GoldenComparison(drifts, compared, other, sorted(set(current) - set(expected)))


@dataclass(frozen=True)
class RateComparison:
    """One cell's ASR on a sample against the same cell of the golden file, by Fisher's exact test."""

    cell: str
    successes: int
    n: int
    golden_successes: int
    golden_n: int
    p: float
    p_holm: float
    differs: bool


def asr_against_golden(table: pl.DataFrame, golden: dict[str, Any], alpha: float = 0.05) -> list[RateComparison]:
    """Each cell of a sample run (another sample size than the golden cell's, other scenarios) held to the golden
    file by its ASR: Fisher's exact test on the two 2 x 2 counts, which carries both sides' sampling error, Holm
    over the cells. With a few scenarios per cell only a large change is detectable; a p_holm below ``alpha``
    says the rate moved."""
    from scipy.stats import fisher_exact  # scipy.stats (seconds cold): only when a check runs

    from rvu_pipelines.attacks.paired import holm

    current = _cells(table)
    rows: list[tuple[str, int, int, int, int, float]] = []
    for cell in sorted(set(current) & set(golden["cells"])):
        now, then = current[cell], golden["cells"][cell]
        n, golden_n = int(now["n"] or 0), int(then.get("n") or 0)
        if not n or not golden_n or now["asr"] is None or then.get("asr") is None:
            continue
        k, golden_k = round(float(now["asr"]) * n), round(float(then["asr"]) * golden_n)
        p = float(fisher_exact([[k, n - k], [golden_k, golden_n - golden_k]]).pvalue)
        rows.append((cell, k, n, golden_k, golden_n, p))
    adjusted = holm([row[-1] for row in rows])
    return [
        RateComparison(*row, p_holm=p_holm, differs=p_holm < alpha) for row, p_holm in zip(rows, adjusted, strict=True)
    ]


def rate_comparison_markdown(comparisons: Sequence[RateComparison]) -> str:
    """The comparisons as a table (the check's metadata)."""
    if not comparisons:
        return "No cell of this run is in the golden file."
    lines = ["| cell | this run | golden | p (Fisher) | p (Holm) | moved |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {c.cell} | {c.successes}/{c.n} | {c.golden_successes}/{c.golden_n} | {c.p:.3g} | {c.p_holm:.3g} | "
        f"{'yes' if c.differs else 'no'} |"
        for c in comparisons
    ]
    return "\n".join(lines)


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
            f"Golden file {path} has no `cells` object (keyed benchmark/attack/defense); regenerate it with "
            "`rvu regress --update-golden`."
        )
    malformed = sorted(cell for cell in document["cells"] if len(cell.split("/")) != 3 or not all(cell.split("/")))
    if malformed:
        raise ConfigError(
            f"Golden file {path} has cells not keyed benchmark/attack/defense ({', '.join(malformed[:3])}); "
            "regenerate it with `rvu regress --update-golden`."
        )
    return document


def _count_drift(cell: str, metric: str, now: int, then: int, tolerance: Tolerance) -> Drift | None:
    delta = now - then
    allowed = tolerance.of(metric)
    # n must match exactly (a scenario that errored or vanished is not scored); errors may only grow by
    # the tolerance (fewer errors than golden is a fix, and shows up in n)
    moved = delta != 0 if metric == "n" else delta > allowed
    return Drift(cell, metric, float(then), float(now), float(delta), allowed) if moved else None


def compare_to_golden(table: pl.DataFrame, golden: dict[str, Any], tolerance: Tolerance) -> list[Drift]:
    """Every count and metric of every cell that moved beyond tolerance; cells on one side only are
    drifts too, and so is a rate that is undefined (no episode scored) on one side only. A golden cell
    without ``errors`` (files written before it was recorded) counts as 0 errors."""
    return _cell_drifts(_cells(table), golden["cells"], tolerance)


def _cell_drifts(
    current: dict[str, dict[str, float | None]], expected: dict[str, Any], tolerance: Tolerance
) -> list[Drift]:
    drifts = []
    for cell in sorted(set(current) | set(expected)):
        if cell not in current or cell not in expected:
            for metric in (*COUNTS, *METRICS):
                side = current.get(cell) or expected.get(cell) or {}
                value = side.get(metric)
                now, then = (value, None) if cell in current else (None, value)
                drifts.append(Drift(cell, metric, then, now, None, tolerance.of(metric)))
            continue
        now_cell, then_cell = current[cell], expected[cell]
        for metric in COUNTS:
            drift = _count_drift(
                cell, metric, int(now_cell.get(metric) or 0), int(then_cell.get(metric) or 0), tolerance
            )
            if drift is not None:
                drifts.append(drift)
        for metric in METRICS:
            now, then = now_cell.get(metric), then_cell.get(metric)
            if isinstance(then, float) and math.isnan(then):
                then = None
            if now is None and then is None:  # undefined on both sides: n and errors tell the story
                continue
            if now is None or then is None:
                drifts.append(Drift(cell, metric, then, now, None, tolerance.of(metric)))
                continue
            delta = now - then
            if abs(delta) > tolerance.of(metric) + 1e-9:
                drifts.append(Drift(cell, metric, then, now, round(delta, 6), tolerance.of(metric)))
    return drifts


def regression_sweep(
    harness: Harness,
    defenses: Sequence[str] = DEFENSES,
    *,
    attacks: Sequence[str] = (NATIVE,),
    scenarios: Sequence[Scenario] | None = None,
    progress: bool = True,
) -> list[CellRun]:
    """The canonical cells as the nightly schedule and ``rvu regress`` run them, every attack under every
    defense: every episode re-run against the current code (stored rows are never replayed; identical prompts
    still hit the LLM response cache). ``defenses`` / ``scenarios``: a subset, for tests."""
    return [
        run
        for attack in attacks
        for run in harness.run_table(
            CANONICAL, defenses, progress=progress, rerun=True, scenarios=scenarios, attack=attack
        )
    ]


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return "missing"
    return f"{value:.0f}" if metric in COUNTS else f"{value:.3f}"


def drift_markdown(drifts: list[Drift]) -> str:
    if not drifts:
        return "No cell moved beyond tolerance (n, errors, ASR, utility)."
    lines = ["| cell | metric | golden | now | delta | tolerance |", "|---|---|---|---|---|---|"]
    for d in drifts:
        if d.metric == "n":
            allowed = "exact"
        elif d.metric == "errors":
            allowed = f"+{d.tolerance:.0f}"
        else:
            allowed = f"{d.tolerance:.2f}"
        delta = "missing" if d.delta is None else (f"{d.delta:+.0f}" if d.metric in COUNTS else f"{d.delta:.3f}")
        lines.append(
            f"| {d.cell} | {d.metric} | {_fmt(d.metric, d.golden)} | {_fmt(d.metric, d.current)} | {delta} | "
            f"{allowed} |"
        )
    return "\n".join(lines)


def drifts_as_dicts(drifts: list[Drift]) -> list[dict[str, Any]]:
    return [asdict(d) for d in drifts]
