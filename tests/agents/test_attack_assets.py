"""The attack harness through Dagster on the real tiny model: a partitioned cell materializes, logs one
MLflow run, and a second materialization of the finished cell does no LLM inference; Table 1's golden
check fails when a golden value is moved beyond tolerance; the nightly schedule is defined."""

from __future__ import annotations

import json

from dagster import DagsterInstance, materialize

from assets.attacks import attack_cell
from assets.definitions import defs
from assets.models import model_assets
from resources import LocalTableIOManager, MlflowTrackerResource
from resources.deployments import deployment_resources
from rvu_pipelines.agents.regression import Tolerance, compare_to_golden, golden_path, load_golden
from rvu_pipelines.tracking import MlflowTracker

EXPERIMENT = "attack-assets-test"
PARTITION = "native.vanilla|canonical"  # dimensions in name order: arm, benchmark


def _run_config(limit: int = 1) -> dict:
    return {
        "ops": {
            "attack_cell": {
                "config": {"limit": limit, "detector": "heuristic", "max_tokens": 48, "max_iters": 2, "progress": False}
            }
        }
    }


def test_cell_materializes_then_rematerializes_without_inference(tmp_path) -> None:
    tracker = MlflowTracker(experiment=EXPERIMENT)
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracker.tracking_uri, experiment=EXPERIMENT),
    }
    llm_model = next(a for a in model_assets() if a.key.to_user_string() == "llm_model")
    with DagsterInstance.ephemeral() as instance:
        assert materialize([llm_model], resources=resources, instance=instance).success
        results = [
            materialize(
                [llm_model, attack_cell],
                selection=[attack_cell],
                partition_key=PARTITION,
                resources=resources,
                instance=instance,
                run_config=_run_config(),
            )
            for _ in range(2)
        ]
    metadata = [next(e.materialization.metadata for e in r.get_asset_materialization_events()) for r in results]
    assert all(r.success for r in results)
    assert metadata[0]["episodes_run"].value == 1 and metadata[0]["llm_calls"].value >= 1
    assert metadata[1]["episodes_run"].value == 0 and metadata[1]["llm_inferences"].value == 0
    assert metadata[1]["n"].value == metadata[0]["n"].value == 1

    runs = [r for r in tracker.latest_runs(20) if r.data.tags.get("cell") == "tiny/canonical/native/vanilla"]
    assert len(runs) == 2 and {r.data.tags["partition"] for r in runs} == {PARTITION}
    assert "asr" in runs[0].data.metrics and runs[0].data.params["defense"] == "vanilla"
    assert runs[0].data.params["attack"] == "native" and runs[0].data.tags["attack"] == "native"
    from rvu_pipelines.code_version import code_version

    assert {r.data.tags["code_version"] for r in runs} == {code_version()}  # tag (every run) and param
    assert runs[0].data.params["code_version"] == code_version() and metadata[1]["code_version"].value == code_version()


def _materialize_one_cell(tmp_path, partition: str):
    """The model asset and one attack cell, in a fresh instance (one short episode per scenario)."""
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=MlflowTracker(experiment=EXPERIMENT).tracking_uri),
    }
    llm_model = next(a for a in model_assets() if a.key.to_user_string() == "llm_model")
    with DagsterInstance.ephemeral() as instance:
        return materialize(
            [llm_model, attack_cell],
            partition_key=partition,
            resources=resources,
            instance=instance,
            run_config=_run_config(),
        )


def test_a_cell_that_cannot_run_materializes_empty_and_says_why(tmp_path) -> None:
    result = _materialize_one_cell(tmp_path, "adaptive.hfer|canonical")  # no adaptive attack against hfer here
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == "attack_cell"]
    metadata = event.materialization.metadata
    assert metadata["dagster/row_count"].value == 0 and "no adaptive attack against hfer" in metadata["not_run"].value
    assert result.output_for_node("attack_cell").height == 0


def test_a_per_scenario_cell_runs_the_scenarios_its_strings_were_made_for(tmp_path) -> None:
    """Not the benchmark's own sample, where no scenario has a string: the committed strings' scenarios."""
    from rvu_pipelines.attacks.optimised import PER_SCENARIO
    from rvu_pipelines.paths import config_dir

    result = _materialize_one_cell(tmp_path, f"{PER_SCENARIO}.vanilla|injecagent_dh")
    assert result.success
    rows = result.output_for_node("attack_cell")
    made_for = sorted(
        p.stem.replace("__", "/") for p in (config_dir() / "attacks" / f"{PER_SCENARIO}_tiny").glob("*.json")
    )
    assert rows["scenario_id"].to_list() == [s for s in made_for if s.startswith("injecagent/dh/")][:1]
    assert rows["error"].to_list() == [None]


def test_golden_check_fails_when_a_golden_value_moves(tmp_path) -> None:
    import polars as pl

    golden = load_golden(golden_path("tiny"))
    rows = [
        {"benchmark": cell.split("/")[0], "attack": cell.split("/")[1], "defense": cell.split("/")[2], **values}
        for cell, values in golden["cells"].items()
    ]
    table = pl.DataFrame(rows)
    assert compare_to_golden(table, golden, Tolerance()) == []
    moved = json.loads(json.dumps(golden))
    first = sorted(moved["cells"])[0]
    moved["cells"][first]["asr"] = (
        min(1.0, moved["cells"][first]["asr"] + 0.3)
        if moved["cells"][first]["asr"] < 0.7
        else moved["cells"][first]["asr"] - 0.3
    )
    drifts = compare_to_golden(table, moved, Tolerance())
    assert [(d.cell, d.metric) for d in drifts] == [(first, "asr")]


def test_nightly_schedule_runs_table_1_and_the_benchmark_samples_at_two() -> None:
    repository = defs.get_repository_def()
    schedule = repository.get_schedule_def("nightly_regression_sweep")
    assert schedule.cron_schedule == "0 2 * * *"
    job = repository.get_job(schedule.job_name)
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {
        "attack_table_1",
        "attack_benchmark_samples",
    }
    assert job.tags.get("rvu/sweep") == "nightly"
    checks = {k.name for k in job.asset_layer.asset_graph.asset_check_keys}
    assert {"matches_golden", "asr_matches_golden_full"} <= checks  # the sample is held to the full table's rates


def test_nightly_sweep_reruns_every_episode_against_the_current_code() -> None:
    """The 02:00 run must not replay stored rows; its run config sets `rerun` (and the
    job's tag forces it in the asset too, for a run launched by hand)."""
    from dagster import build_schedule_context

    from assets.attacks import NIGHTLY_TAG, HarnessConfig

    schedule = defs.get_repository_def().get_schedule_def("nightly_regression_sweep")
    requests = schedule.evaluate_tick(build_schedule_context()).run_requests or []
    assert [r.run_config["ops"]["attack_table_1"]["config"]["rerun"] for r in requests] == [True]
    assert [r.run_config["ops"]["attack_benchmark_samples"]["config"]["rerun"] for r in requests] == [True]
    assert HarnessConfig().rerun is False  # interactive materializations keep same-code reuse
    job = defs.get_repository_def().get_job(schedule.job_name)
    assert job.tags.get(NIGHTLY_TAG[0]) == NIGHTLY_TAG[1]


def test_the_benchmark_samples_cover_the_full_tables_benchmarks_and_refuse_others() -> None:
    """Every benchmark of the full table's golden file is sampled, so each sampled cell has a golden cell to be
    held to; the configured AgentDojo subset (no golden cell) and unknown names are refused by field."""
    import pytest

    from assets.attacks import SamplesConfig, chosen_sweep_benchmarks
    from rvu_pipelines.agents.regression import golden_full_path
    from rvu_pipelines.errors import ConfigError

    golden = {cell.split("/")[0] for cell in load_golden(golden_full_path("tiny"))["cells"]}
    assert golden == set(SamplesConfig().benchmarks) == set(chosen_sweep_benchmarks(SamplesConfig().benchmarks))
    for wrong in (["agentdojo"], ["injecagent"], []):
        with pytest.raises(ConfigError, match="benchmarks"):
            chosen_sweep_benchmarks(wrong)
    assert chosen_sweep_benchmarks(["bipia_code", "agentdojo_slack", "bipia_code"]) == ["bipia_code", "agentdojo_slack"]
