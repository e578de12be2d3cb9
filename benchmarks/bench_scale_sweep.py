"""The attack table and the detector sweep, embedded vs the local scale profile's executors, side by side.

Run:  RVU_DATA_MIRROR=../shared/data .venv/bin/python benchmarks/bench_scale_sweep.py     (make bench-sweep)
      ... --defenses vanilla fath --skip-detectors

Each configuration starts from an empty state folder (no configuration reuses another's LLM response cache or
trained detectors) and runs the same work:
- attack table: the cells ``canonical`` × ``native`` (``--attack``) × defenses of ``attack_cells_job`` with the
  job's default config (limit 20: all 10 canonical scenarios; a backfill takes no run config), one run per cell;
- detector sweep: ``detectors_job`` (three corpora, D2 + D4 trained and registered per corpus, D1-D5 evaluated,
  leave one data set out) on stratified subsamples (``quick_run_config``), one run whose steps fan out.
Configurations:
1. embedded: SQLite instance, one ``dagster job execute`` after another, in-process steps, llama.cpp in-process;
2. scale profile, multiprocess executor, runs queued one at a time (``rvu scale up`` with no celery: PostgreSQL,
   MLflow server, daemon, one llama.cpp server);
3. the same with two runs at a time (attack table only: the detector sweep is one run);
4. scale profile, dagster-celery with 2 workers, each with its own llama.cpp server (one core each), 2 runs at a time.
Prints each wall time, the ratio to embedded, whether every cell's ASR/utility and every detector's F1 equals the
embedded run's, and the peak number of PostgreSQL connections while the profile worked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_results import Row, add_results_dir_argument, record  # noqa: E402

from rvu_pipelines.scale.postgres_server import free_port  # noqa: E402
from rvu_pipelines.scale.profile import Ports, ScaleProfile, embedded_environment  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")


@dataclass(frozen=True)
class Workload:
    name: str
    job: str
    partitions: tuple[str, ...]  # one run per partition; () = one unpartitioned run with ``config``
    config: dict | None
    metric: Callable[[str], bool]  # which MLflow metrics must agree between configurations
    upstream: tuple[str, ...] = ()  # assets to materialize first, untimed


@dataclass(frozen=True)
class Configuration:
    name: str
    workers: int | None  # None: embedded; 0: multiprocess; n: celery with n workers
    concurrent_runs: int = 1
    workloads: tuple[str, ...] = ("attack", "detectors")


def dagster(args: list[str], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run([str(BIN / "dagster"), *args], capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode:
        raise SystemExit(f"dagster {' '.join(args[:4])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def partition_tags(cell: str) -> str:
    """The tags that make a run of a multi-partitioned job one partition (what the UI and backfills set); a
    cell key reads ``<attack>.<defense>|<benchmark>`` (dimensions arm and benchmark, in name order)."""
    arm, benchmark = cell.split("|")
    return json.dumps(
        {"dagster/partition": cell, "dagster/partition/arm": arm, "dagster/partition/benchmark": benchmark}
    )


def tracked_metrics(tracking_uri: str, workload: Workload) -> dict[str, dict[str, float]]:
    """Per MLflow run name, the workload's metrics (finished runs only)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    out: dict[str, dict[str, float]] = {}
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
        metrics = {m: round(v, 6) for m, v in sorted(run.data.metrics.items()) if workload.metric(m)}
        if metrics and run.info.status == "FINISHED":
            out[run.info.run_name] = metrics
    return dict(sorted(out.items()))


def run_embedded(workload: Workload, home: Path) -> tuple[float, dict]:
    (home / "dagster_home").mkdir(parents=True, exist_ok=True)
    env = embedded_environment(home, dict(os.environ))
    for asset in workload.upstream:
        dagster(["asset", "materialize", "-m", "assets.definitions", "--select", asset], env, home)
    started = time.perf_counter()
    base = ["job", "execute", "-m", "assets.definitions", "-j", workload.job]
    if workload.partitions:
        for cell in workload.partitions:
            dagster([*base, "--tags", partition_tags(cell)], env, home)
    else:
        config = home / f"{workload.name}.json"  # `job execute` takes config files only (JSON is YAML)
        config.write_text(json.dumps(workload.config))
        dagster([*base, "--config", str(config)], env, home)
    return time.perf_counter() - started, tracked_metrics(env["MLFLOW_TRACKING_URI"], workload)


class ConnectionPeak:
    """Samples PostgreSQL's client connections (pg_stat_activity) every second while the profile works."""

    def __init__(self, url: str) -> None:
        self.url, self.peak, self._stop = url, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as connection:
            while not self._stop.wait(1.0):
                query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                row = connection.execute(query).fetchone()
                self.peak = max(self.peak, int(row[0]) - 1 if row else 0)  # not this sampler's own

    def __enter__(self) -> ConnectionPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_scaled(workload: Workload, profile: ScaleProfile, home: Path) -> tuple[float, dict]:
    import psycopg

    env = {**os.environ, **profile.environment()}
    for asset in workload.upstream:
        dagster(
            ["asset", "materialize", "-m", "assets.definitions", "--select", asset],
            {**env, "RVU_EXECUTOR": "in_process"},
            home,
        )
    workspace = ["-w", str(REPO / "workspace.yaml"), "-j", workload.job]
    started = time.perf_counter()
    if workload.partitions:
        dagster(["job", "backfill", *workspace, "--partitions", ",".join(workload.partitions), "--noprompt"], env, home)
    else:
        dagster(["job", "launch", *workspace, "--config-json", json.dumps(workload.config)], env, home)
    expected = len(workload.partitions) or 1
    while True:
        with psycopg.connect(profile.database_url("dagster")) as connection:
            rows = connection.execute("SELECT status FROM runs WHERE pipeline_name = %s", (workload.job,)).fetchall()
        statuses = [row[0] for row in rows]
        if len(statuses) >= expected and all(s in TERMINAL for s in statuses):
            break
        time.sleep(2)
    seconds = time.perf_counter() - started
    if set(statuses) != {"SUCCESS"}:
        raise SystemExit(f"{workload.job} runs ended {statuses}; logs in {profile.root / 'logs'}")
    return seconds, tracked_metrics(profile.mlflow_url, workload)


def run_configuration(configuration: Configuration, workloads: list[Workload], home: Path) -> dict:
    home.mkdir(parents=True)
    home.chmod(0o711)
    chosen = [w for w in workloads if w.name in configuration.workloads]
    if configuration.workers is None:
        return {w.name: run_embedded(w, home) for w in chosen} | {"connections": None}
    os.environ["RVU_HOME"] = str(home / "state")  # the services' state folder (empty caches)
    profile = ScaleProfile(
        home / "scale",
        Ports(*(free_port() for _ in range(5))),
        workers=configuration.workers,
        max_concurrent_runs=configuration.concurrent_runs,
    )
    try:
        profile.up()
        with ConnectionPeak(profile.database_url("dagster")) as peak:
            results = {w.name: run_scaled(w, profile, home) for w in chosen}
        return results | {"connections": peak.peak}
    finally:
        profile.down()


def main() -> int:
    from assets.detectors import quick_run_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", default="canonical")
    parser.add_argument("--defenses", nargs="+", default=["vanilla", "fath", "rvg", "rvu_v2"])
    parser.add_argument("--attack", default="native", help="the attack of every cell")
    parser.add_argument("--detector-samples", type=int, default=200, help="train and test subsample per corpus")
    parser.add_argument("--skip-detectors", action="store_true")
    add_results_dir_argument(parser)
    args = parser.parse_args()
    n = args.detector_samples
    workloads = [
        Workload(
            "attack",
            "attack_cells_job",
            tuple(f"{args.attack}.{d}|{args.benchmark}" for d in args.defenses),
            None,
            lambda m: m in ("asr", "utility"),
            upstream=("llm_model",),
        ),
        Workload(
            "detectors",
            "detectors_job",
            (),
            quick_run_config(max_train_samples=n, max_test_samples=n),
            lambda m: m.endswith("_f1"),
        ),
    ]
    if args.skip_detectors:
        workloads = workloads[:1]
    configurations = [
        Configuration("embedded, in-process", None),
        Configuration("scale, multiprocess, 1 run at a time", 0, 1),
        Configuration("scale, multiprocess, 2 runs at a time", 0, 2, ("attack",)),
        Configuration("scale, celery, 2 workers, 2 runs at a time", 2, 2),
    ]
    root = Path(tempfile.mkdtemp(prefix="rvu-bench-sweep-"))
    root.chmod(0o711)
    results: dict[str, dict] = {}
    try:
        for i, configuration in enumerate(configurations):
            results[configuration.name] = run_configuration(configuration, workloads, root / f"c{i}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = results[configurations[0].name]
    cells = ", ".join(workloads[0].partitions)
    print(f"\nattack: {cells} (the job's default config); detectors: detectors_job on {n}-sample subsamples")
    print(f"{'configuration':48s} {'workload':10s} {'wall s':>8s} {'embedded/this':>14s}  results")
    rows = []
    for name, result in results.items():
        for workload in workloads:
            if workload.name not in result:
                continue
            seconds, metrics = result[workload.name]
            base_seconds, base_metrics = base[workload.name]
            same = "same as embedded" if metrics == base_metrics else f"DIFFERENT: {json.dumps(metrics)[:400]}"
            print(f"{name:48s} {workload.name:10s} {seconds:8.1f} {base_seconds / seconds:13.2f}x  {same}")
            if name != configurations[0].name:
                what = f"{workload.name} wall time" + ("" if metrics == base_metrics else " (results DIFFER)")
                rows.append(Row(what, configurations[0].name, base_seconds, name, seconds, "s", False))
        if result["connections"] is not None:
            print(f"{'':48s} peak PostgreSQL client connections: {result['connections']}")
    for workload in workloads:
        print(f"embedded {workload.name}: {json.dumps(base[workload.name][1])[:1500]}")
    record(__file__, rows, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
