"""Attack-table cells, embedded vs the local scale profile, side by side in one run (issue 16).

Run:  .venv/bin/python benchmarks/bench_scale_sweep.py                       (4 canonical cells)
      .venv/bin/python benchmarks/bench_scale_sweep.py --defenses vanilla fath

Each configuration starts from an empty state folder (so no configuration reuses another's LLM response cache)
and runs the same cells of ``attack_cells_job`` (benchmark × defense partitions) with the job's default config
(limit 20: all 10 canonical scenarios; a backfill takes no run config):
1. embedded: SQLite instance, one ``dagster job execute --partition`` after another, in-process steps;
2. scale, one run at a time: ``rvu scale up`` (PostgreSQL, MLflow server, daemon; no celery: one step per run),
   the cells submitted as one backfill, the queued run coordinator limited to 1 concurrent run;
3. scale, two runs at a time (max_concurrent_runs = 2).
Prints the wall time of each and, per cell, ASR / utility from each configuration's MLflow runs, which must be
equal (the agent is deterministic: temperature 0, fixed seeds). On 2 cores expect no gain from 2 concurrent runs:
llama.cpp already uses both cores in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rvu_pipelines.scale.postgres_server import free_port  # noqa: E402
from rvu_pipelines.scale.profile import Ports, ScaleProfile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
METRICS = ("asr", "utility")


def cell_metrics(tracking_uri: str) -> dict[str, dict[str, float]]:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    out = {}
    for run in client.search_runs(experiments):
        metrics = {m: round(run.data.metrics[m], 6) for m in METRICS if m in run.data.metrics}
        if metrics:
            out[run.info.run_name] = metrics
    return dict(sorted(out.items()))


def materialize_upstream(env: dict[str, str], cwd: Path) -> None:
    """The cells read the ``llm_model`` asset (the resolved, sha256-checked model): materialize it first, untimed."""
    done = subprocess.run(
        [str(BIN / "dagster"), "asset", "materialize", "-m", "rvu_pipelines.definitions", "--select", "llm_model"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )
    if done.returncode:
        raise SystemExit(f"materializing llm_model failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def partition_tags(cell: str) -> str:
    """The tags that make a run of a multi-partitioned job one partition (what the UI and backfills set)."""
    benchmark, defense = cell.split("|")
    return json.dumps(
        {
            "dagster/partition": cell,
            "dagster/partition/benchmark": benchmark,
            "dagster/partition/defense": defense,
        }
    )


def embedded(cells: list[str], home: Path) -> tuple[float, dict]:
    (home / "dagster_home").mkdir(parents=True)
    tracking = f"sqlite:///{home / 'mlflow.db'}"
    env = {
        **os.environ,
        "RVU_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster_home"),
        "MLFLOW_TRACKING_URI": tracking,
        "RVU_EXECUTOR": "in_process",
    }
    materialize_upstream(env, home)
    started = time.perf_counter()
    for cell in cells:
        done = subprocess.run(
            [
                str(BIN / "dagster"),
                "job",
                "execute",
                "-m",
                "rvu_pipelines.definitions",
                "-j",
                "attack_cells_job",
                "--tags",
                partition_tags(cell),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=home,
        )
        if done.returncode:
            raise SystemExit(f"embedded run of {cell} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, cell_metrics(tracking)


def scaled(cells: list[str], home: Path, concurrent: int) -> tuple[float, dict]:
    import psycopg

    home.mkdir(parents=True)
    home.chmod(0o711)
    os.environ["RVU_HOME"] = str(home)  # the services' state folder (the LLM cache starts empty)
    profile = ScaleProfile(
        home / "scale",
        Ports(free_port(), free_port(), free_port(), free_port()),
        workers=0,
        max_concurrent_runs=concurrent,
    )
    try:
        profile.up()
        env = {**os.environ, **profile.environment()}
        materialize_upstream(env, home)
        started = time.perf_counter()
        done = subprocess.run(
            [
                str(BIN / "dagster"),
                "job",
                "backfill",
                "-w",
                str(REPO / "workspace.yaml"),
                "-j",
                "attack_cells_job",
                "--partitions",
                ",".join(cells),
                "--noprompt",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=home,
        )
        if done.returncode:
            raise SystemExit(f"backfill failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        while True:
            with psycopg.connect(profile.database_url("dagster")) as connection:
                query = "SELECT status FROM runs WHERE pipeline_name = 'attack_cells_job'"  # not llm_model's run
                statuses = [row[0] for row in connection.execute(query).fetchall()]
            if len(statuses) == len(cells) and all(s in ("SUCCESS", "FAILURE", "CANCELED") for s in statuses):
                break
            time.sleep(2)
        seconds = time.perf_counter() - started
        if set(statuses) != {"SUCCESS"}:
            raise SystemExit(f"scale runs ended {statuses}; logs in {profile.root / 'logs'}")
        return seconds, cell_metrics(profile.mlflow_url)
    finally:
        profile.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", default="canonical")
    parser.add_argument("--defenses", nargs="+", default=["vanilla", "fath", "rvg", "rvu_v2"])
    args = parser.parse_args()
    cells = [f"{args.benchmark}|{defense}" for defense in args.defenses]
    root = Path(tempfile.mkdtemp(prefix="rvu-bench-sweep-"))
    root.chmod(0o711)
    try:
        results = {
            "embedded, in-process, one run after another": embedded(cells, root / "embedded"),
            "scale profile, 1 run at a time": scaled(cells, root / "scale1", 1),
            "scale profile, 2 runs at a time": scaled(cells, root / "scale2", 2),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base_seconds, base_metrics = next(iter(results.values()))
    print(f"\n{len(cells)} cells of attack_cells_job ({', '.join(cells)}), the job's default config, empty LLM caches")
    for name, (seconds, metrics) in results.items():
        same = "same ASR/utility as embedded" if metrics == base_metrics else f"DIFFERENT: {metrics}"
        print(f"  {name:46s} {seconds:7.1f} s   ratio embedded/this {base_seconds / seconds:4.2f}x   {same}")
    print(f"  per cell (embedded): {json.dumps(base_metrics)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
