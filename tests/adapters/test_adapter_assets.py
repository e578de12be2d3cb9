"""The adapter sample asset materialized in-process on real data and the packaged LLM: a few LoRA training steps
per adapter, the gate and influence over them, a memorising adapter loaded vs evicted, the WMDP scorer; at a
smaller size than make run's (every part runs, on fewer steps and items)."""

from __future__ import annotations

from dagster import DagsterInstance, materialize

from assets.adapters import adapter_sample
from assets.datasets import dataset_assets
from assets.models import model_assets
from resources import LocalTableIOManager, MlflowTrackerResource
from resources.deployments import deployment_resources
from rvu_pipelines.adapters.admission import BEHAVIOURAL_LAYERS
from rvu_pipelines.tracking import MlflowTracker

EXPERIMENT = "adapter-assets-test"
# make run's sizes are AdapterSampleConfig's defaults; the asset's parts are each tested at full size elsewhere
SIZE = {"steps": 1, "max_examples": 4, "members": 4, "member_steps": 3, "wmdp_items": 1}
SIZE |= {"n_probes": 2, "max_new_tokens": 4, "n_sensitive": 1, "n_qa": 1, "n_knowledge": 2, "n_follow_ups": 1}
SIZE |= {"n_hazard": 1}
INPUTS = {"tofu", "deepset_prompt_injections", "trustair_jailbreaks", "awesome_chatgpt_prompts", "wmdp_cyber"}
INPUTS |= {"agentpoison_strategyqa"}


def test_adapter_sample_materializes_with_checks_and_mlflow(tmp_path) -> None:
    tracker = MlflowTracker(experiment=EXPERIMENT)
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracker.tracking_uri, experiment=EXPERIMENT),
    }
    wanted = INPUTS | {"llm_model", "embedder_model"}
    selected = [a for a in [*dataset_assets(), *model_assets()] if a.key.to_user_string() in wanted]
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [*selected, adapter_sample],
            resources=resources,
            instance=instance,
            run_config={"ops": {"adapter_sample": {"config": SIZE}}},
        )
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["sample_ran"].passed
    report = result.output_for_node("adapter_sample")
    assert set(report["gate"]["layers"]) == {
        "projection",
        "safe_lora",
        "combined",
        "all_layers",
        "fisher",
        "any_layer",
        *BEHAVIOURAL_LAYERS,
    }
    gate = report["agent_runtime"]["gate"]  # the harmful adapter offered to llama.cpp through the enforcing gate
    assert gate["decision"] in {"admit", "refuse"} and set(gate["layers"]) <= set(BEHAVIOURAL_LAYERS)
    assert report["membership"]["status"] == "run" and report["membership"]["verdict"] in {"clean", "inconclusive"}
    assert report["wmdp"]["n"] == SIZE["wmdp_items"]
    runs = [r for r in tracker.latest_runs() if r.data.tags.get("asset_key") == "adapter_sample"]
    assert runs and runs[0].data.metrics["train_seconds"] > 0
