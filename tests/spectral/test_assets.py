"""The spectral assets materialized in-process on real data and the packaged LLM: the sampled asset (8 examples
a set) and one partitioned cell (12 examples), with their checks and MLflow runs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from dagster import AssetCheckSeverity, DagsterInstance, Failure, MultiPartitionKey, materialize

from assets.datasets import dataset_assets
from assets.models import model_assets
from assets.spectral import _checked_graph, spectral_kill_switch_cell, spectral_kill_switch_sample, spectral_partitions
from resources import LocalTableIOManager, MlflowTrackerResource
from resources.deployments import deployment_resources
from rvu_pipelines.errors import ModelUnavailableError
from rvu_pipelines.models import ModelStore
from rvu_pipelines.paths import PublicSources
from rvu_pipelines.spectral.cell import (
    SOURCES,
    cell_sample,
    fitting_groups,
    load_cell_model,
    profile_names,
    token_counts,
)
from rvu_pipelines.tracking import MlflowTracker

EXPERIMENT = "spectral-assets-test"


@pytest.mark.slow  # 16 full forward passes + the data and model assets: minutes on a loaded 2-core machine
def test_spectral_sample_materializes_with_checks_and_mlflow(tmp_path, spectral_model) -> None:
    tracker = MlflowTracker(experiment=EXPERIMENT)
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracker.tracking_uri, experiment=EXPERIMENT),
    }
    wanted = {"tofu", "injecagent", "llm_model"}
    selected = [a for a in [*dataset_assets(), *model_assets()] if a.key.to_user_string() in wanted]
    selected.append(spectral_kill_switch_sample)
    run_config = {"ops": {"spectral_kill_switch_sample": {"config": {"per_set": 8}}}}
    with DagsterInstance.ephemeral() as instance:
        result = materialize(selected, resources=resources, instance=instance, run_config=run_config)
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["heldout_auroc_reported"].passed
    assert checks["context_verification_auroc_goal"].severity == AssetCheckSeverity.WARN
    assert checks["statistic_latency_goal"].metadata["ms_per_layer"].value > 0
    report = result.output_for_node("spectral_kill_switch_sample")
    assert set(report) == {"context_verification", "injecagent"}
    for entry in report.values():
        assert entry["n_calibration"] == 4 and entry["n_heldout"] == 4
        assert len(entry["hfer_by_layer"]) == 30
    runs = tracker.latest_runs(max_results=5)
    assert any("context_verification_auroc" in run.data.metrics for run in runs)


# --- the partitioned cells (data source × model profile) ---------------------------------------------------

CELL_EXPERIMENT = "spectral-cells-test"
CELL_UPSTREAM = ("tofu", "bipia", "injecagent", "deepset_prompt_injections")


@pytest.fixture(scope="module")
def cell_setup(tmp_path_factory, shared_data, new_mlflow_store):
    """The four data sets materialized once into a module's instance; the cell tests then select the cell."""
    base = tmp_path_factory.mktemp("spectral_cells")
    tracker = MlflowTracker(new_mlflow_store(base / "mlflow.db"), CELL_EXPERIMENT)
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(base / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracker.tracking_uri, experiment=CELL_EXPERIMENT),
    }
    upstream = [a for a in dataset_assets() if a.key.to_user_string() in CELL_UPSTREAM]
    with DagsterInstance.ephemeral() as instance:
        assert materialize(upstream, resources=resources, instance=instance).success
        yield {"resources": resources, "instance": instance, "upstream": upstream, "tracker": tracker}


def _materialize_cell(setup: dict, profile: str, source: str, config: dict, **kwargs):
    return materialize(
        [spectral_kill_switch_cell, *setup["upstream"]],
        selection=[spectral_kill_switch_cell],
        partition_key=MultiPartitionKey({"profile": profile, "source": source}),
        resources=setup["resources"],
        instance=setup["instance"],
        run_config={"ops": {"spectral_kill_switch_cell": {"config": config}}},
        **kwargs,
    )


def test_spectral_partitions_are_sources_by_profiles() -> None:
    keys = set(spectral_partitions.get_partition_keys())
    assert {"tiny|context_verification", "tiny|bipia", "tiny|injecagent", "tiny|deepset", "paper|bipia"} <= keys
    assert len(keys) == len(SOURCES) * len(profile_names())


def test_a_cell_materializes_with_its_checks_plots_and_mlflow_run(cell_setup, spectral_model) -> None:
    """tiny × injecagent on 12 real examples (8 calibrate, 4 held out); the small calibration is 4 (2 draws)."""
    result = _materialize_cell(cell_setup, "tiny", "injecagent", {"limit": 12, "small": 4, "draws": 2})
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert set(checks) == {"heldout_auroc_reported", "auroc_goal", "calibration_20_vs_all", "overhead_goal"}
    assert checks["heldout_auroc_reported"].passed
    for name in ("auroc_goal", "calibration_20_vs_all", "overhead_goal"):
        assert checks[name].severity == AssetCheckSeverity.WARN
    assert checks["auroc_goal"].metadata["goal"].value == 0.90
    assert 0.0 <= checks["auroc_goal"].metadata["auroc"].value <= 1.0
    assert checks["calibration_20_vs_all"].metadata["draws"].value == 2
    assert checks["overhead_goal"].metadata["ms_per_layer"].value > 0
    assert checks["overhead_goal"].metadata["tokens"].value > 0
    report = result.output_for_node("spectral_kill_switch_cell")
    assert (report["source"], report["profile"]) == ("injecagent", "tiny")
    assert (report["n_calibration"], report["n_heldout"], report["small_size"]) == (8, 4, 4)
    assert len(report["hfer_by_layer"]) == spectral_model.n_layers and len(report["calibrated_small"]) == 2
    for name in ("hfer_histograms_png", "roc_png"):
        assert Path(report["files"][name]).stat().st_size > 0
    run = next(
        r for r in cell_setup["tracker"].latest_runs() if r.data.tags["asset_key"] == "spectral_kill_switch_cell"
    )
    assert run.data.tags["partition"] == "tiny|injecagent"
    assert 0.0 <= run.data.metrics["heldout_auroc"] <= 1.0 and "heldout_auroc_cal4_mean" in run.data.metrics
    from mlflow.tracking import MlflowClient

    artifacts = {a.path for a in MlflowClient(cell_setup["tracker"].tracking_uri).list_artifacts(run.info.run_id)}
    assert {"roc.png", "hfer_histograms.png", "switches.md", "hfer_by_layer.md"} <= artifacts


def test_a_profile_without_its_weights_fails_with_the_reason(cell_setup) -> None:
    """The paper profile's LLM comes from the hub; offline (the tests' HF_HUB_OFFLINE) the cell fails with a
    message that names the profile and the way out, before any work."""
    with pytest.raises(ModelUnavailableError, match="profile 'paper'.*offline.*'tiny' profile"):
        load_cell_model("paper", store=ModelStore(public=PublicSources(offline=True)))
    result = _materialize_cell(cell_setup, "paper", "bipia", {"limit": 8}, raise_on_error=False)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    description = failure.step_failure_data.user_failure_data.description
    assert "profile 'paper'" in description and "offline" in description


def test_a_cell_sample_keeps_whole_pairs_and_both_classes(spectral_sets, spectral_model) -> None:
    for source in ("injecagent", "deepset"):
        sample = cell_sample(spectral_sets[source], 20)
        held = sample.filter(pl.col("split") == "heldout")
        assert sample.height == 20 and held.height == 8
        for split in ("calibration", "heldout"):
            part = sample.filter(pl.col("split") == split)
            assert part["label"].sum() == part.height // 2  # pairs, or (deepset) half of each class
    pairs = cell_sample(spectral_sets["injecagent"], 20).group_by("group").len()
    assert set(pairs["len"]) == {2}
    # a pair with one member over the token limit leaves as a pair (the extractor would skip only that member)
    bipia = spectral_sets["bipia"]
    fitting, dropped = fitting_groups(spectral_model, bipia, 200)
    assert 0 < dropped < bipia.height and fitting.height == bipia.height - dropped
    assert set(fitting.group_by("group").len()["len"]) == {2}
    assert max(token_counts(spectral_model, fitting["text"].to_list())) <= 200


def test_an_unknown_graph_configuration_fails_naming_the_field_and_the_choices() -> None:
    assert _checked_graph("sink_free_norm") == "sink_free_norm"
    with pytest.raises(Failure) as failure:
        _checked_graph("sinkfree")
    assert "config graph" in str(failure.value.description) and "sink_free_norm" in str(failure.value.description)
