"""`rvu summary`: one short row per domain, headline metrics marked against their goals, `--all` the full dump.

The runs are real MLflow runs in a SQLite store under tmp_path, tagged as the assets tag theirs, in the
experiments the summary's table names.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from rvu_pipelines.cli import cli
from rvu_pipelines.run_summary import (
    DOMAINS,
    FAIL,
    HEADLINES,
    NO_GOAL,
    PASS,
    Headline,
    format_age,
    pass_mark,
)
from rvu_pipelines.tracking import DOMAIN_EXPERIMENTS

NOT_RUN = "spectral switch"  # the domain the store below has no run of
# Values chosen against the goals: (asset, metric) -> value; every other headline gets a passing value.
VALUES = {
    ("detector_d4_deepset", "test_f1"): 0.95,  # goal >= 0.9474: passes
    ("detector_d2_deepset", "test_f1"): 0.9,  # no goal
    ("detector_production", "calibration_calibration_fpr"): 0.02,  # goal <= 0.01: fails
    ("memory_poisoning_sample", "protocol_asr_r_faithful"): 0.5,  # goal >= 0.8: fails
    ("memory_monitor_evaluation", "leaks"): 0.0,  # goal <= 0: passes at the goal
}
MONITOR_CHECKS = 12


def _passing(headline: Headline) -> float:
    if headline.goal is None:
        return 0.5
    return headline.goal + (0.01 if headline.higher_is_better else -0.01) * max(abs(headline.goal), 1.0)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, new_mlflow_store) -> dict[str, str]:
    """A store with every domain's headline runs but one, buried under many more runs with many more metrics."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("summary")
    uri = new_mlflow_store(root / "mlflow.db")
    state = root / "state"
    (state / "assets").mkdir(parents=True)
    (state / "assets" / "detector_d4_deepset.json").write_text("{}")
    client = MlflowClient(tracking_uri=uri)
    experiments: dict[str, str] = {}
    start = int(time.time() * 1000) - 3_600_000  # an hour ago, one second apart: newest last

    def run(domain: str, tags: dict[str, str], metrics: dict[str, float]) -> None:
        nonlocal start
        name = next(d.experiment for d in DOMAINS if d.name == domain)
        if name not in experiments:
            experiments[name] = client.create_experiment(name)
        start += 1000
        created = client.create_run(experiments[name], start_time=start, tags=tags)
        batch = [Metric(k, v, start, 0) for k, v in metrics.items()]
        for i in range(0, len(batch), 500):
            client.log_batch(created.info.run_id, metrics=batch[i : i + 500])
        client.set_terminated(created.info.run_id, "FINISHED")

    noise = {f"noise_metric_{i:03d}": float(i) for i in range(150)}
    # An older Table 1 cell under no defense: the newer one below is the one shown.
    cell = {"asset_key": "attack_table_1", "benchmark": "canonical", "attack": "native"}
    run("attacks (Table 1)", {**cell, "defense": "vanilla"}, {"asr": 0.9})
    for headline in HEADLINES:
        if headline.domain == NOT_RUN:
            continue
        value = VALUES.get((headline.asset, headline.metric), _passing(headline))
        run(headline.domain, {"asset_key": headline.asset, **dict(headline.tags)}, {headline.metric: value, **noise})
    checks = {f"check_rule_{i}": 1.0 for i in range(MONITOR_CHECKS - 1)} | {"check_rule_broken": 0.0}
    run("memory monitor", {"asset_key": "memory_monitor_evaluation"}, {**checks, **noise})
    for _ in range(60):  # newer runs of other assets, with the same metric names and many more
        run("attacks (Table 1)", {"asset_key": "attack_benchmark_samples", "defense": "vanilla"}, {"asr": 1.0, **noise})
    return {"MLFLOW_TRACKING_URI": uri, "RVU_HOME": str(state)}


@pytest.fixture(scope="module")
def compact(store: dict[str, str]) -> str:
    result = CliRunner().invoke(cli, ["summary"], env=store)
    assert result.exit_code == 0, result.output
    return result.output


def _row_text(output: str, domain: str) -> str:
    """The lines of one domain's table row (rich splits a row over lines; a rule ends it)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"│ {domain} "))
    block = []
    for line in lines[start:]:
        if line.startswith(("├", "└")):
            break
        block.append(line)
    return "\n".join(block)


def test_compact_view_fits_in_forty_lines(compact: str) -> None:
    lines = compact.rstrip("\n").splitlines()
    assert len(lines) <= 40, compact
    assert "noise_metric" not in compact
    for domain in DOMAINS:
        assert domain.experiment in _row_text(compact, domain.name)
    assert "make dev" in compact and "http://127.0.0.1:3000" in compact
    assert "make mlflow-ui" in compact and "http://127.0.0.1:5000" in compact


def test_metrics_are_marked_against_their_goals(compact: str) -> None:
    assert f"D4 F1, deepset (paper) 0.95 (≥ 0.9474) {PASS}" in _row_text(compact, "detectors")
    assert f"production FPR 0.02 (≤ 0.01) {FAIL}" in _row_text(compact, "detectors")
    assert f"D2 F1, deepset 0.9 {NO_GOAL}" in _row_text(compact, "detectors")
    assert f"AgentPoison ASR-R 0.5 (≥ 0.8) {FAIL}" in _row_text(compact, "memory poisoning (MEMSAD)")
    assert f"cross-session leaks 0 (≤ 0) {PASS}" in _row_text(compact, "memory monitor")


def test_each_headline_comes_from_its_own_newest_cell(compact: str) -> None:
    """Table 1's cells share metric names: the defense tag picks the cell, the newest run of it wins."""
    attacks = _row_text(compact, "attacks (Table 1)")
    assert "ASR, no defense 0.5 –" in attacks  # not the older 0.9, nor a benchmark sample's run
    assert "finished" in attacks and "outputs 0/1" in attacks
    assert "outputs 1/5" in _row_text(compact, "detectors")


def test_checks_from_mlflow_or_the_dagster_ui(compact: str) -> None:
    assert f"{MONITOR_CHECKS - 1}/{MONITOR_CHECKS} {FAIL}" in _row_text(compact, "memory monitor")
    assert "see Dagster UI" in _row_text(compact, "detectors")


def test_a_domain_without_a_run_says_how_to_run_it(compact: str) -> None:
    row = _row_text(compact, NOT_RUN)
    assert "not run" in row and "make run" in row


def test_an_empty_store_says_not_run_everywhere(tmp_path: Path, new_mlflow_store) -> None:
    env = {"MLFLOW_TRACKING_URI": new_mlflow_store(tmp_path / "mlflow.db"), "RVU_HOME": str(tmp_path / "state")}
    result = CliRunner().invoke(cli, ["summary"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.count("not run") == len(DOMAINS)


def test_all_prints_every_metric_of_every_recent_run(store: dict[str, str]) -> None:
    result = CliRunner().invoke(cli, ["summary", "--all"], env=store)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Asset outputs (1) in" in out
    for header in ("MLflow run", "experiment", "asset", "status", "metrics"):
        assert header in out
    assert "noise_metric_149=149" in out and "check_rule_broken=0" in out
    assert f"tracking store {store['MLFLOW_TRACKING_URI']}" in out


@pytest.mark.parametrize(
    ("value", "goal", "higher", "mark"),
    [
        (0.96, 0.95, True, PASS),
        (0.95, 0.95, True, PASS),
        (0.94, 0.95, True, FAIL),
        (0.5, 1.0, False, PASS),
        (1.5, 1.0, False, FAIL),
        (0.5, None, True, NO_GOAL),
        (None, 0.9, True, NO_GOAL),
        (math.nan, 0.9, True, NO_GOAL),
    ],
)
def test_pass_mark(value: float | None, goal: float | None, higher: bool, mark: str) -> None:
    assert pass_mark(value, goal, higher) == mark


def test_format_age() -> None:
    assert [format_age(s) for s in (5, 125, 7300, 200_000)] == ["just now", "2m ago", "2h ago", "2d ago"]


def test_the_table_names_the_default_job_its_experiments_and_assets() -> None:
    """Every default-job asset belongs to one domain; each domain's experiment is its assets' group's experiment;
    every headline names a real asset of its domain's experiment, at most three a domain."""
    from assets.definitions import defs
    from assets.jobs import default_profile_job

    graph = defs.resolve_asset_graph()
    selected = {key.to_user_string() for key in default_profile_job.selection.resolve(graph)}
    listed = [key for domain in DOMAINS for key in domain.assets]
    assert sorted(listed) == sorted(selected)
    groups = {key.to_user_string(): graph.get(key).group_name for key in graph.get_all_asset_keys()}
    for domain in DOMAINS:
        assert {DOMAIN_EXPERIMENTS[groups[key]] for key in domain.assets} == {domain.experiment}, domain.name
        headlines = [h for h in HEADLINES if h.domain == domain.name]
        assert 1 <= len(headlines) <= 3, domain.name
        for headline in headlines:
            assert DOMAIN_EXPERIMENTS[groups[headline.asset]] == domain.experiment, headline
