"""The memory-poisoning asset layer materializes for real: one attack x regime cell (InjecMEM at |M| = 200,
the cheapest attack) with its MLflow run, tables and plots; the study checks read the paper's claims."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from dagster import DagsterInstance, MultiPartitionKey, materialize

from assets.datasets import dataset_assets
from assets.memory_poisoning import memory_poisoning_cell, study_checks
from assets.models import model_assets
from resources import LocalTableIOManager, MlflowTrackerResource
from resources.deployments import deployment_resources
from rvu_pipelines.memory_poisoning.runner import StudyResult
from rvu_pipelines.memory_poisoning.study_cells import StudyConfig
from rvu_pipelines.tracking import MlflowTracker

UPSTREAM = ("agentpoison_strategyqa", "minja", "injecagent", "embedder_model", "llm_model")


def test_a_poisoning_cell_materializes_and_logs_to_mlflow(tmp_path: Path, monkeypatch, new_mlflow_store) -> None:
    monkeypatch.setenv("RVU_HOME", str(tmp_path / "rvu"))
    tracking_uri = new_mlflow_store(tmp_path / "mlflow.db")
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracking_uri, experiment="poisoning-test"),
    }
    upstream = [a for a in [*dataset_assets(), *model_assets()] if a.key.to_user_string() in UPSTREAM]
    with DagsterInstance.ephemeral() as instance:
        assert materialize(upstream, resources=resources, instance=instance).success
        result = materialize(
            [memory_poisoning_cell, *upstream],
            selection=[memory_poisoning_cell],
            partition_key=MultiPartitionKey({"attack": "injecmem", "regime": "small"}),
            resources=resources,
            instance=instance,
        )
    assert result.success
    summary = result.output_for_node("memory_poisoning_cell")
    matrix = pl.DataFrame(summary["matrix"])
    assert set(matrix["attack"]) == {"injecmem"} and {"memsad", "energy", "hybrid"} <= set(matrix["defense"])
    out = tmp_path / "rvu" / "memory_poisoning" / "cells" / "injecmem-small"
    assert (out / "paper_table.md").read_text().startswith("| defense |") and (out / "roc.png").stat().st_size > 0
    runs = MlflowTracker(tracking_uri, "poisoning-test").latest_runs()
    run = next(r for r in runs if r.data.tags.get("asset_key") == "memory_poisoning_cell")
    assert run.data.tags["partition"] == "injecmem|small"
    assert 0 <= run.data.metrics["injecmem_memsad_plain_auroc"] <= 1
    # the study checks are measured, not assumed: an AUROC below the paper's fails its check
    checks = study_checks(StudyResult(StudyConfig(), matrix.with_columns(pl.lit(0.5).alias("auroc")), {}))
    assert checks["memsad_auroc_at_least_paper"][0] is False


def test_the_study_jobs_take_what_a_run_may_change_as_config() -> None:
    from dagster import DagsterInvalidConfigError, validate_run_config

    from assets.definitions import defs
    from assets.memory_poisoning import SeedsRunConfig
    from rvu_pipelines.memory_poisoning.seeds import SWEEP_REGIMES, SWEEP_SEEDS

    study = defs.resolve_job_def("memory_poisoning_job")
    chosen = {"regime": "full", "adaptive_poisons": 8, "llm": True}
    assert validate_run_config(study, {"ops": {"memory_poisoning_study": {"config": chosen}}})
    from pydantic import ValidationError

    from assets.memory_poisoning import StudyRunConfig

    with pytest.raises(ValidationError, match="regime 'huge' is not one of: small, medium, full"):
        StudyRunConfig(regime="huge")
    with pytest.raises(ValidationError, match="regime 'tiny'"):
        SeedsRunConfig(regimes=["medium", "tiny"])
    with pytest.raises(DagsterInvalidConfigError, match="adaptive_poisons"):
        validate_run_config(study, {"ops": {"memory_poisoning_study": {"config": {"adaptive_poisons": "all"}}}})
    defaults = SeedsRunConfig()
    assert tuple(defaults.regimes) == SWEEP_REGIMES and tuple(defaults.seeds) == SWEEP_SEEDS
    seeds = defs.resolve_job_def("memory_poisoning_seeds_job")
    assert validate_run_config(seeds, {"ops": {"memory_poisoning_seeds": {"config": {"regimes": ["medium"]}}}})
