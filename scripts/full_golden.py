"""Write the attack table's committed golden results (configs/golden/table1_full_<profile>.json) from the tables
of the runs named: each `make attacks ATTACKS_CONFIG=configs/runs/attacks_<run>.yaml` keeps its table under
``<RVU_HOME>/attacks/full/<profile>/<run>/``; their cells (benchmark/attack/defense: n, errors, ASR, utility) are
added to the file, every other cell kept, and the attack study's ``matches_golden_full`` check then compares each
later run with them.

    .venv/bin/python scripts/full_golden.py --run universal_call --run universal_call_defenses

A cell two runs both hold with other values is listed (the later run's values are written): the same scenarios
under the same attack and defense should give the same episodes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

from rvu_pipelines.agents.regression import load_golden, save_golden, union_golden
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import config_dir, state_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="a run's name (its run config's `name`)")
    parser.add_argument("--profile", default=None, help="model profile (configs/models.yaml); default: its default")
    parser.add_argument("--state", type=Path, default=None, help="the state folder (default: RVU_HOME, else .rvu)")
    parser.add_argument("--out", type=Path, default=None, help="default: configs/golden/table1_full_<profile>.json")
    args = parser.parse_args(argv)
    try:
        out, changed = write(args.run, args.profile, args.state, args.out)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for cell in changed:
        print(f"changed: {cell} (a later run gave other values)")
    print(f"written to {out}")
    return 0


def write(runs: list[str], profile: str | None, state: Path | None, out: Path | None) -> tuple[Path, list[str]]:
    from rvu_pipelines.models import ModelStore, load_model_config

    models = load_model_config()
    profile = profile or models.default_profile
    model_id = ModelStore().resolve("llm", models.profile(profile)["llm"]).sha256
    out = out or config_dir() / "golden" / f"table1_full_{profile}.json"
    document = load_golden(out) if out.is_file() else None
    changed: list[str] = []
    for run in runs:
        path = (state or state_dir()) / "attacks" / "full" / profile / run / "table.parquet"
        if not path.is_file():
            raise ConfigError(f"No table for run {run!r} at {path}: run its `make attacks ATTACKS_CONFIG=…` first.")
        document, moved = union_golden(document, pl.read_parquet(path), profile, model_id)
        changed += moved
    assert document is not None  # at least one run (argparse: --run is required)
    return save_golden(document, out), changed


if __name__ == "__main__":
    sys.exit(main())
