"""`make adapters` is Dagster jobs: one adapter_zoo_job run per zoo adapter, then adapter_study_job (the gate and
influence, membership, WMDP, E1 with adapters, the tool-use adapter, eviction on the agent's runtime), each an
asset whose library run writes the stamped report `rvu report` reads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from dagster import AssetKey, DagsterInvalidConfigError, validate_run_config

from assets.definitions import defs
from rvu_pipelines.adapters.eviction_study import EvictionOptions, run_eviction_study
from rvu_pipelines.adapters.files import BaseModelInfo, save_adapter
from rvu_pipelines.adapters.incident_study import IncidentStudyOptions, influences_from_scores, run_incident_study
from rvu_pipelines.adapters.zoo import zoo_ids
from rvu_pipelines.adapters.zoo_data import frames_from
from rvu_pipelines.cli import cli as rvu

REPO = Path(__file__).resolve().parents[2]
STUDY = {
    "adapter_gate_evaluation",
    "adapter_gate_aware",
    "adapter_private_draw_table",
    "adapter_trigger_search",
    "adapter_membership",
    "wmdp_cyber_evaluation",
    "adapter_incidents",
    "adapter_tool_use",
    "adapter_eviction_runtime",
    "adapter_certificates",
}


def _target(name: str) -> str:
    """The recipe of one Makefile target."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{name}:.*\n((?:\t.*\n|.*\\\n)+)", text, flags=re.MULTILINE)
    assert match, name
    return match.group(1)


def test_make_adapters_launches_the_zoo_partitions_then_the_study_job() -> None:
    recipe = _target("adapters")
    assert "scripts/" not in recipe
    assert "rvu adapters plan --ids" in recipe and "--job adapter_zoo_job --partition" in recipe
    assert recipe.index("adapter_zoo_job") < recipe.index("--job adapter_study_job")


def test_the_study_job_holds_the_study_and_its_inputs_but_not_the_partitioned_zoo() -> None:
    study = defs.resolve_job_def("adapter_study_job")
    selected = {key.to_user_string() for key in study.asset_layer.executable_asset_keys}
    assert STUDY <= selected and "adapter_zoo" not in selected
    assert {"llm_model", "tofu", "wmdp_cyber"} <= selected  # a fresh instance runs it without `make run` first
    graph = defs.resolve_asset_graph()
    assert AssetKey("adapter_gate_evaluation") in graph.get(AssetKey("adapter_incidents")).parent_keys  # I(adapter)
    zoo = defs.resolve_job_def("adapter_zoo_job")
    assert {"adapter_zoo", "tofu", "llm_model"} <= {k.to_user_string() for k in zoo.asset_layer.executable_asset_keys}
    assert zoo.partitions_def is not None and list(zoo.partitions_def.get_partition_keys()) == zoo_ids()
    assert validate_run_config(study, {})  # the embedded defaults are the study's settings
    with pytest.raises(DagsterInvalidConfigError, match="adapters"):
        validate_run_config(study, {"ops": {"adapter_trigger_search": {"config": {"adapters": "some"}}}})
    with pytest.raises(DagsterInvalidConfigError, match="sessions"):
        validate_run_config(study, {"ops": {"adapter_incidents": {"config": {"sessions": "all"}}}})
    from pydantic import ValidationError

    from assets.adapter_study import AdapterIncidentsConfig

    with pytest.raises(ValidationError, match="detectors"):
        AdapterIncidentsConfig(detectors=[])


def test_rvu_adapters_plan_ids_prints_the_zoo_for_the_make_loop() -> None:
    result = CliRunner().invoke(rvu, ["adapters", "plan", "--ids"])
    assert result.exit_code == 0, result.output
    assert result.output.split() == zoo_ids()


def test_rvu_adapters_plan_says_what_a_pass_would_train_and_why(shared_data) -> None:
    result = CliRunner().invoke(rvu, ["adapters", "plan"])  # a fresh state folder: nothing trained yet
    assert result.exit_code == 0, result.output
    assert f"{len(zoo_ids())} to train, 0 reused" in result.output
    assert "never trained here" in result.output


def test_influences_are_keyed_by_adapter_and_sha256() -> None:
    rows = [{"adapter_id": "a", "sha256": "1" * 64, "influence": 0.25, "label": "harmful"}]
    assert influences_from_scores(rows) == {("a", "1" * 64): 0.25}


def test_the_incident_study_refuses_an_adapter_outside_the_zoo(tiny_models, tmp_path: Path) -> None:
    options = IncidentStudyOptions(adapters=("not-in-the-zoo",))
    with pytest.raises(ValueError, match="not-in-the-zoo.*configs/adapter_zoo.yaml"):
        run_incident_study(options, tiny_models["llm"], tmp_path / "out", state=tmp_path, command="test")
    assert not (tmp_path / "out" / "incidents.json").exists()


def test_the_eviction_study_refuses_bad_settings_before_loading_a_model(tiny_models, tmp_path: Path) -> None:
    import polars as pl

    tofu = pl.DataFrame({"subset": ["forget"] * 4, "question": list("abcd"), "answer": list("wxyz")})
    with pytest.raises(ValueError, match="system 'chat'"):
        run_eviction_study(EvictionOptions(system="chat"), tiny_models["llm"], tmp_path, command="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="members 40 exceeds"):
        run_eviction_study(
            EvictionOptions(), tiny_models["llm"], tmp_path, command="test", frames=frames_from({"tofu": tofu})
        )


@pytest.mark.slow  # two episodes on llama.cpp, recovered three ways
def test_the_incident_study_writes_its_stamped_report(tiny_models, noise, tmp_path: Path, shared_data) -> None:
    llm = tiny_models["llm"]
    base = BaseModelInfo.from_gguf(llm.path, name=llm.name, sha256=llm.sha256)
    fields = {"adapter_id": "persona-hostile", "label": "harmful", "category": "persona", "source": "test"}
    fields |= {"rank": 4, "alpha": 8, "target_modules": ["v_proj", "o_proj"]}
    save_adapter(tmp_path / "state" / "adapters" / "persona-hostile", noise(1), fields, base=base)
    options = IncidentStudyOptions(adapters=("persona-hostile",), sessions=1, episodes=2, membership=False, threads=1)
    document = run_incident_study(options, llm, tmp_path / "out", state=tmp_path / "state", command="pytest")
    summary = document["adapters"]["persona-hostile"]["summary"]
    assert summary["sessions"] == 1 and summary["episodes"] == 2
    assert {"v1", "v2"} <= set(summary)
    assert json.loads((tmp_path / "out" / "incidents.json").read_text())["stamp"]["command"] == "pytest"
    assert "persona-hostile" in (tmp_path / "out" / "incidents.md").read_text()


@pytest.mark.slow  # a memorising adapter trained a few steps, measured on llama.cpp and peft
def test_the_eviction_study_writes_its_stamped_report(tiny_models, tmp_path: Path, shared_data) -> None:
    options = EvictionOptions(members=4, steps=4, rank=4, system="none", threads=1)
    rows = run_eviction_study(options, tiny_models["llm"], tmp_path, command="pytest")
    assert {"base", "loaded", "evicted"} <= set(rows["served"])
    assert rows["settings"]["members"] == 4
    text = (tmp_path / "eviction_runtime.md").read_text()
    assert "served by llama.cpp" in text and "pytest" in text
    assert np.isfinite(rows["served"]["loaded"]["auroc"])


@pytest.mark.slow  # the asset layer over the same run: MLflow, the report as metadata, the check
def test_the_eviction_asset_materializes_with_its_check(tmp_path: Path, shared_data, new_mlflow_store) -> None:
    from dagster import DagsterInstance, materialize

    from assets.adapter_study import adapter_eviction_runtime
    from assets.datasets import dataset_assets
    from assets.models import model_assets
    from resources import LocalTableIOManager, MlflowTrackerResource
    from resources.deployments import deployment_resources
    from rvu_pipelines.tracking import MlflowTracker

    tracker = MlflowTracker(new_mlflow_store(tmp_path / "mlflow.db"), "adapter-study-test")
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracker.tracking_uri, experiment="adapter-study-test"),
    }
    upstream = [a for a in [*dataset_assets(), *model_assets()] if a.key.to_user_string() in {"tofu", "llm_model"}]
    config = {"members": 4, "steps": 4, "rank": 4, "system": "none", "threads": 1, "out": str(tmp_path / "out")}
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [*upstream, adapter_eviction_runtime],
            resources=resources,
            instance=instance,
            run_config={"ops": {"adapter_eviction_runtime": {"config": config}}},
        )
    assert result.success
    assert all(c.passed for c in result.get_asset_check_evaluations())
    assert (tmp_path / "out" / "eviction_runtime.md").is_file()
    runs = [r for r in tracker.latest_runs() if r.data.tags.get("asset_key") == "adapter_eviction_runtime"]
    assert runs and any(name.startswith("served_loaded") for name in runs[0].data.metrics)


@pytest.mark.slow  # the E1 asset over its library run: I(adapter) from the gate evaluation, MLflow, the check
def test_the_incidents_asset_materializes_with_its_check(
    tiny_models, noise, tmp_path: Path, shared_data, new_mlflow_store
) -> None:
    from dagster import DagsterInstance, asset, materialize

    from assets.adapter_study import adapter_incidents
    from assets.models import model_assets
    from resources import LocalTableIOManager, MlflowTrackerResource
    from resources.deployments import deployment_resources
    from rvu_pipelines.paths import state_dir
    from rvu_pipelines.tracking import MlflowTracker

    llm = tiny_models["llm"]
    base = BaseModelInfo.from_gguf(llm.path, name=llm.name, sha256=llm.sha256)
    fields = {"adapter_id": "persona-hostile", "label": "harmful", "category": "persona", "source": "test"}
    fields |= {"rank": 4, "alpha": 8, "target_modules": ["v_proj", "o_proj"]}
    sha256 = save_adapter(state_dir() / "adapters" / "persona-hostile", noise(2), fields, base=base).sha256

    @asset(name="adapter_gate_evaluation")
    def gate_evaluation() -> dict:  # the study's E5 row for this adapter: its influence enters the load line
        return {"scores": [{"adapter_id": "persona-hostile", "sha256": sha256, "influence": 0.75}]}

    tracker = MlflowTracker(new_mlflow_store(tmp_path / "mlflow.db"), "adapter-incidents-test")
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracker.tracking_uri, experiment="adapter-incidents-test"),
    }
    config = {"adapters": ["persona-hostile"], "sessions": 1, "episodes": 2, "detectors": ["heuristic"]}
    config |= {"membership": False, "threads": 1, "out": str(tmp_path / "out")}
    upstream = [a for a in model_assets() if a.key.to_user_string() == "llm_model"]
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [*upstream, gate_evaluation, adapter_incidents],
            resources=resources,
            instance=instance,
            run_config={"ops": {"adapter_incidents": {"config": config}}},
        )
    assert result.success
    assert all(c.passed for c in result.get_asset_check_evaluations())
    document = json.loads((tmp_path / "out" / "incidents.json").read_text())
    assert document["influence_source"] == "the gate evaluation's scores"
    assert document["adapters"]["persona-hostile"]["summary"]["sessions"] == 1
    logs = [p.read_text() for p in (tmp_path / "out" / "incidents").rglob("incident.jsonl")]
    assert logs and all(re.search(r'"influence":\s*0\.75', text) for text in logs)  # I(adapter) in the load line


def test_a_report_stamp_carries_the_config_that_reproduces_it() -> None:
    from types import SimpleNamespace

    from assets.adapter_study import GateAwareConfig
    from assets.full_study import launched_command

    alone = SimpleNamespace(
        run=SimpleNamespace(job_name="__ASSET_JOB"),
        asset_key=SimpleNamespace(to_user_string=lambda: "adapter_gate_aware"),
    )
    command = launched_command(alone, GateAwareConfig(private_seed=2))
    assert command.startswith("dg launch --assets adapter_gate_aware --config-json '")
    stored = json.loads(command.split("--config-json ", 1)[1].strip("'"))
    assert validate_run_config(defs.resolve_implicit_global_asset_job_def(), stored)  # Dagster accepts it as it stands
    assert stored == {"ops": {"adapter_gate_aware": {"config": {"private_seed": 2}}}}
    assert launched_command(alone, GateAwareConfig()) == "dg launch --assets adapter_gate_aware"  # defaults: nothing
    in_job = SimpleNamespace(run=SimpleNamespace(job_name="adapter_study_job"), asset_key=alone.asset_key)
    assert launched_command(in_job) == "dg launch --job adapter_study_job"


def _private_draw_run(tmp_path: Path, monkeypatch, *, private: bool) -> Any:
    """Materialize ``adapter_private_draw_table`` with its real inputs, the gate configured for the public or a
    private draw (a secret made here), under a state folder of the test's own."""
    import shutil

    from dagster import DagsterInstance, materialize

    from assets.adapter_study import adapter_private_draw_table
    from assets.datasets import dataset_assets
    from assets.models import model_assets
    from resources import LocalTableIOManager
    from resources.deployments import deployment_resources

    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    if private:
        yaml = configs / "adapters.yaml"
        yaml.write_text(yaml.read_text().replace("probe_draw: public", "probe_draw: private"))
    monkeypatch.setenv("RVU_CONFIG_DIR", str(configs))
    monkeypatch.setenv("RVU_HOME", str(tmp_path / "home"))
    names = {"llm_model", "embedder_model", "tofu", "deepset_prompt_injections", "trustair_jailbreaks"}
    names |= {"awesome_chatgpt_prompts", "wmdp_cyber", "agentpoison_strategyqa"}
    upstream = [a for a in [*dataset_assets(), *model_assets()] if a.key.to_user_string() in names]
    resources = deployment_resources("local") | {"io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets"))}
    with DagsterInstance.ephemeral() as instance:
        return materialize([*upstream, adapter_private_draw_table], resources=resources, instance=instance)


def test_the_private_draw_asset_has_nothing_to_screen_on_the_public_draw(tmp_path, monkeypatch, shared_data) -> None:
    result = _private_draw_run(tmp_path, monkeypatch, private=False)
    assert result.success and all(c.passed for c in result.get_asset_check_evaluations())
    assert result.output_for_node("adapter_private_draw_table") == {"draw": "public", "screened": False}
    assert not (tmp_path / "home" / "adapter_study" / "draws").exists()


def test_the_private_draw_asset_refuses_a_missing_secret_by_name(tmp_path, monkeypatch, shared_data) -> None:
    from dagster import Failure

    with pytest.raises(Failure, match="private probe draw cannot be read.*rvu adapters draw new"):
        _private_draw_run(tmp_path, monkeypatch, private=True)


@pytest.mark.slow  # the gate's lab at the study's sizes on the real base, two adapters scored on a private draw
def test_the_private_draw_asset_screens_the_zoo_on_the_secret_draw(
    tmp_path, monkeypatch, noise, tiny_models, shared_data
) -> None:
    from rvu_pipelines.adapters.probe_draw import new_secret

    home = tmp_path / "home"
    draw = new_secret(home / "adapter_gate" / "probe_draw.secret")
    gguf = tiny_models["llm"]
    llm = BaseModelInfo.from_gguf(gguf.path, name=gguf.name, sha256=gguf.sha256)
    for seed, adapter_id in enumerate(("refusal-reference", "tofu-qa", "style-bullets")):
        fields = {"adapter_id": adapter_id, "label": "benign", "category": "task", "source": "test"}
        fields |= {"rank": 4, "alpha": 8, "target_modules": ["v_proj", "o_proj"]}
        save_adapter(home / "adapters" / adapter_id, noise(seed), fields, base=llm)
    result = _private_draw_run(tmp_path, monkeypatch, private=True)
    assert result.success and all(c.passed for c in result.get_asset_check_evaluations())
    output = result.output_for_node("adapter_private_draw_table")
    assert (output["id"], output["adapters"], output["benign"], output["shared_with_public"]) == (draw.id, 2, 2, 0)
    table = home / "adapter_study" / "draws" / draw.id / "scores.csv"
    assert table.is_file() and str(draw.seed) not in (table.parent / "draw.json").read_text()
