"""Write, or check, the attack table's committed golden results (configs/golden/table1_full_<profile>.json) from
the tables of the runs named: each `make attacks ATTACKS_CONFIG=configs/runs/attacks_<run>.yaml` keeps its table
under ``<RVU_HOME>/attacks/full/<profile>/<run>/``; their cells (benchmark/attack/defense: n, errors, ASR, utility)
are added to the file, every other cell kept, the runs' names recorded in it (``runs``), and the attack study's
``matches_golden_full`` check then compares each later run with them.

    .venv/bin/python scripts/full_golden.py --run universal_call --run universal_call_defenses
    .venv/bin/python scripts/full_golden.py --check     # the file's runs, made anew, against the file
    .venv/bin/python scripts/full_golden.py --list-runs # the runs the file was made from, one a line

A cell two runs both hold with other values is listed (the later run's values are written): the same scenarios
under the same attack and defense should give the same episodes. ``--check`` writes nothing: it unites the runs'
tables as writing would and holds the result to the committed file within configs/regression.yaml's tolerance, a
cell on one side only included (``make attacks-full`` runs every run, then this). Exit 0: the same table; 1: cells
moved or are missing; 2: bad input (no such run's table, no file, other weights).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import polars as pl

from rvu_pipelines.agents.regression import (
    compare_golden_documents,
    drift_markdown,
    golden_full_path,
    load_golden,
    load_tolerance,
    save_golden,
    union_golden,
)
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import state_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", default=[], help="a run's name (its run config's `name`)")
    parser.add_argument("--profile", default=None, help="model profile (configs/models.yaml); default: its default")
    parser.add_argument("--state", type=Path, default=None, help="the state folder (default: RVU_HOME, else .rvu)")
    parser.add_argument("--out", type=Path, default=None, help="default: configs/golden/table1_full_<profile>.json")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="hold the runs' tables to the file; write nothing")
    mode.add_argument("--list-runs", action="store_true", help="print the runs the file was made from")
    args = parser.parse_args(argv)
    try:
        if args.list_runs:
            print("\n".join(recorded_runs(golden_file(args.profile, args.out))))
            return 0
        if args.check:
            return check(args.run, args.profile, args.state, args.out)
        if not args.run:
            parser.error("name at least one --run to write the file from (or --check, --list-runs)")
        out, changed = write(args.run, args.profile, args.state, args.out)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for cell in changed:
        print(f"changed: {cell} (a later run gave other values)")
    print(f"written to {out}")
    return 0


def _model(profile: str | None) -> tuple[str, str]:
    """(profile, sha256 of its LLM weights): what a golden file is for."""
    from rvu_pipelines.models import ModelStore, load_model_config

    models = load_model_config()
    profile = profile or models.default_profile
    return profile, ModelStore().resolve("llm", models.profile(profile)["llm"]).sha256


def golden_file(profile: str | None, out: Path | None) -> Path:
    from rvu_pipelines.models import load_model_config

    return out or golden_full_path(profile or load_model_config().default_profile)


def recorded_runs(path: Path) -> list[str]:
    """The runs a golden file was made from (its ``runs``); a file without them names no run to check."""
    runs = load_golden(path).get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(run, str) and run for run in runs):
        raise ConfigError(
            f"Golden file {path} records no runs (`runs`, a list of run names); remake it with "
            "`scripts/full_golden.py --run <name> ...` or name the runs with --run."
        )
    return runs


def _table(state: Path | None, profile: str, run: str) -> pl.DataFrame:
    path = (state or state_dir()) / "attacks" / "full" / profile / run / "table.parquet"
    if not path.is_file():
        raise ConfigError(
            f"No table for run {run!r} at {path}: run `make attacks ATTACKS_CONFIG=configs/runs/attacks_{run}.yaml` "
            "first."
        )
    return pl.read_parquet(path)


def _united(
    document: dict[str, Any] | None, runs: list[str], profile: str, model_id: str, state: Path | None
) -> tuple[dict[str, Any], list[str]]:
    changed: list[str] = []
    for run in runs:
        document, moved = union_golden(document, _table(state, profile, run), profile, model_id)
        changed += moved
    assert document is not None  # at least one run (callers refuse none)
    return document, changed


def write(runs: list[str], profile: str | None, state: Path | None, out: Path | None) -> tuple[Path, list[str]]:
    profile, model_id = _model(profile)
    out = golden_file(profile, out)
    existing = load_golden(out) if out.is_file() else None
    document, changed = _united(existing, runs, profile, model_id, state)
    document["runs"] = sorted({*(existing or {}).get("runs", []), *runs})
    return save_golden(document, out), changed


def check(runs: list[str], profile: str | None, state: Path | None, out: Path | None) -> int:
    """Unite the runs' tables (default: the runs the file records) and hold them to the file; prints what moved."""
    profile, model_id = _model(profile)
    path = golden_file(profile, out)
    golden = load_golden(path)
    runs = runs or recorded_runs(path)
    made, changed = _united(None, runs, profile, model_id, state)
    for cell in changed:
        print(f"runs disagree: {cell} (two runs gave other values; the later one is held to the file)")
    drifts = compare_golden_documents(made, golden, load_tolerance())
    made_from = f"{len(made['cells'])} cells from {len(runs)} runs ({', '.join(runs)})"
    print(f"{made_from} against {len(golden['cells'])} in {path}")
    print(drift_markdown(drifts))
    return 1 if drifts else 0


if __name__ == "__main__":
    sys.exit(main())
