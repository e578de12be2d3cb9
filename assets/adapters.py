"""Seed 000's adapter half as assets over real LoRA adapters (the library is ``rvu_pipelines.adapters``):

- ``adapter_zoo``: one partition per adapter of ``configs/adapter_zoo.yaml``, trained with peft on the agent's
  own weights from its data set (lineage from the dataset assets), reused when data and settings are unchanged;
  an MLflow run per training (loss curve, settings, the adapter folder as artifact);
- ``adapter_sample``: the study in miniature for the default job (a few steps, a few examples).

The study over the trained zoo (E4-E7, E1 with adapters, the tool-use adapter, eviction on the agent's runtime)
is ``assets.adapter_study`` (``make adapters``).
"""

from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetSelection,
    Config,
    MetadataValue,
    Output,
    StaticPartitionsDefinition,
    asset,
    define_asset_job,
)
from pydantic import Field

from assets.executors import JOB_EXECUTOR
from assets.profiles import FULL_STUDY
from resources import MlflowTrackerResource
from rvu_pipelines.adapters.report import gate_markdown
from rvu_pipelines.adapters.sample import SampleSize
from rvu_pipelines.adapters.study import AdapterLab, scores_frame
from rvu_pipelines.adapters.zoo import load_zoo_config, zoo_ids, zoo_root
from rvu_pipelines.adapters.zoo_data import probe_frames
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.paths import state_dir
from rvu_pipelines.tracking import metric_name

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

# one partition per adapter of configs/adapter_zoo.yaml: the evaluated zoo, its safety reference and the agent's
# tool-use adapter
adapter_partitions = StaticPartitionsDefinition(zoo_ids())

GROUP = "adapters"
TRAIN_SECONDS_GOAL = 300.0  # goal: training one adapter on a 2-core CPU


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=GROUP,
    kinds={"mlflow"},
    partitions_def=adapter_partitions,
    description="One real LoRA adapter of the zoo (configs/adapter_zoo.yaml): peft on the packaged SmolLM2 "
    "de-quantised to float32, CPU, fixed seed, trained on its builder's rows of the data sets below; written as "
    "safetensors + manifest (sha256, base model sha256, training data digest, seed, rank, targets) to "
    ".rvu/adapters/<id>/ and reused while its data and settings are unchanged.",
    check_specs=[
        AssetCheckSpec("loss_decreased", asset="adapter_zoo", blocking=True),
        AssetCheckSpec("training_time_goal", asset="adapter_zoo"),
    ],
)
def adapter_zoo(
    context: AssetExecutionContext,
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    embedder_model: dict,
    tofu: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
    agentpoison_strategyqa: pl.DataFrame,
    wmdp_cyber: pl.DataFrame,
):
    from rvu_pipelines.adapters.files import BaseModelInfo
    from rvu_pipelines.adapters.zoo import train_zoo_entry
    from rvu_pipelines.models.dequantized import load_dequantized

    config = load_zoo_config()
    entry = config.get(context.partition_key)
    frames = probe_frames(
        tofu,
        deepset_prompt_injections,
        trustair_jailbreaks,
        awesome_chatgpt_prompts,
        agentpoison_strategyqa=agentpoison_strategyqa,
        wmdp_cyber=wmdp_cyber,
    )
    model, tokenizer = load_dequantized(llm_model["path"], sha256=llm_model["sha256"], attn_implementation="sdpa")
    base = BaseModelInfo.of(model, name=llm_model["name"], sha256=llm_model["sha256"])
    settings = config.settings(entry)
    params = {"adapter_id": entry.id, "label": entry.label, "category": entry.category, "builder": entry.builder}
    params |= {k: str(v) for k, v in vars(settings).items()}
    with mlflow_tracker.run_for(context, params=params, name=f"adapter_zoo/{entry.id}") as run:
        manifest, trained = train_zoo_entry(config, entry, model, tokenizer, base, frames)
        losses = trained.losses if trained is not None else []
        for step, loss in enumerate(losses):
            run.log_metrics({"train_loss": loss}, step=step)
        run.log_metrics(
            {"final_loss": manifest.final_loss or 0.0, "training_seconds": manifest.training_seconds or 0.0}
        )
        run.log_artifact(zoo_root() / entry.id, artifact_path="adapter")
    record = manifest.model_dump(mode="json")
    yield Output(
        record,
        metadata={
            "sha256": manifest.sha256,
            "label": manifest.label,
            "trained_now": trained is not None,
            "training_seconds": manifest.training_seconds,
            "final_loss": manifest.final_loss,
            "examples": manifest.training_data.n_examples if manifest.training_data else 0,
            "mlflow_run_id": run.run_id,
        },
    )
    yield AssetCheckResult(
        check_name="loss_decreased",
        passed=bool(trained is None or (len(losses) > 1 and min(losses[-5:]) < losses[0])),
        metadata={"first": losses[0] if losses else None, "last": losses[-1] if losses else None},
    )
    yield AssetCheckResult(
        check_name="training_time_goal",
        passed=bool((manifest.training_seconds or 0) <= TRAIN_SECONDS_GOAL),
        severity=AssetCheckSeverity.WARN,
        metadata={"seconds": manifest.training_seconds, "goal_seconds": TRAIN_SECONDS_GOAL},
    )


_SIZE = SampleSize()


class AdapterSampleConfig(Config):
    """How much of each part the sample runs (``adapters.sample.SampleSize``); the defaults are make run's."""

    steps: int = Field(default=_SIZE.steps, ge=1, description="training steps per zoo adapter")
    max_examples: int = Field(default=_SIZE.max_examples, ge=1, description="training examples per zoo adapter")
    members: int = Field(default=_SIZE.members, ge=2, description="forget questions the memorising adapter learns")
    member_steps: int = Field(default=_SIZE.member_steps, ge=1, description="its training steps")
    wmdp_items: int = Field(default=_SIZE.wmdp_items, ge=1, description="WMDP items scored")
    n_probes: int = Field(default=_SIZE.n_probes, ge=2, description="gate probe prompts")
    max_new_tokens: int = Field(default=_SIZE.max_new_tokens, ge=1, description="tokens generated per probe")
    n_sensitive: int = Field(default=_SIZE.n_sensitive, ge=1, description="sensitive-list margin items")
    n_qa: int = Field(default=_SIZE.n_qa, ge=1, description="held-out QA margin items")
    n_knowledge: int = Field(default=_SIZE.n_knowledge, ge=1, description="knowledge-base margin items")
    n_follow_ups: int = Field(
        default=_SIZE.n_follow_ups, ge=1, description="answers the follow-up lines are scored after"
    )
    n_hazard: int = Field(default=_SIZE.n_hazard, ge=1, description="hazardous-list (WMDP-cyber) items")

    def size(self) -> SampleSize:
        return SampleSize(**self.model_dump())


@asset(
    code_version=CODE_VERSION,
    group_name=GROUP,
    kinds={"mlflow"},
    description="The adapter study in miniature (default job): four zoo adapters trained for a few steps on a few "
    "dozen examples, the gate's layers and influence over them, a memorising adapter on 12 TOFU forget "
    "questions scored loaded vs evicted against 12 non-members, the WMDP scorer on a few items. Shows every part "
    "runs; the study's numbers come from make adapters.",
    check_specs=[AssetCheckSpec("sample_ran", asset="adapter_sample", blocking=True)],
)
def adapter_sample(
    context: AssetExecutionContext,
    config: AdapterSampleConfig,
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    embedder_model: dict,
    tofu: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
    wmdp_cyber: pl.DataFrame,
    agentpoison_strategyqa: pl.DataFrame,
):
    from rvu_pipelines.adapters.sample import run_adapter_sample
    from rvu_pipelines.result_memo import ResultMemo, frame_digest, reuse_message

    inputs = {
        "tofu": tofu,
        "deepset": deepset_prompt_injections,
        "trustair": trustair_jailbreaks,
        "awesome": awesome_chatgpt_prompts,
        "wmdp": wmdp_cyber,
        "strategyqa": agentpoison_strategyqa,
    }
    memo = ResultMemo.default().entry(
        "adapter_sample",
        {
            "llm_sha256": llm_model["sha256"],
            "embedder_sha256": embedder_model["sha256"],
            "frames": {name: frame_digest(frame) for name, frame in inputs.items()},
            "size": config.model_dump(),
        },
        code=__name__,
    )
    stored = memo.load()
    reused = stored is not None
    if stored is not None:  # nothing it depends on changed since that MLflow run
        context.log.info(reuse_message(stored))
    else:
        frames = probe_frames(
            tofu,
            deepset_prompt_injections,
            trustair_jailbreaks,
            awesome_chatgpt_prompts,
            wmdp_cyber=wmdp_cyber,
            agentpoison_strategyqa=agentpoison_strategyqa,
        )
        size = config.size()
        lab = AdapterLab.from_records(llm_model, embedder_model, frames, **size.lab())
        sample = run_adapter_sample(
            lab, state_dir() / "adapter_sample", llm_gguf=Path(str(llm_model["path"])), size=size
        )
        frame = scores_frame(sample.scores)
        with mlflow_tracker.run_for(context, params={"adapters": len(sample.scores)}) as run:
            run.log_metrics({metric_name(f"{k}_seconds"): v for k, v in sample.seconds.items()})
            run.log_metrics(
                {"combined_auroc": sample.gate.layers["combined"].auroc, "wmdp_accuracy": sample.wmdp["accuracy"]}
            )
        stored = memo.save(
            {
                "value": {
                    "gate": sample.gate.to_dict(),
                    "influence": sample.influence,
                    "membership": sample.membership,
                    "wmdp": sample.wmdp,
                    "agent_runtime": sample.runtime,
                },
                "report": gate_markdown(sample.gate, sample.influence, frame),
                "seconds": {k: round(v, 1) for k, v in sample.seconds.items()},
                "n_scores": len(sample.scores),
                "mlflow_run_id": run.run_id,
            }
        )
    value = stored["value"]
    membership, wmdp, runtime = value["membership"], value["wmdp"], value["agent_runtime"]
    loaded = max(v["auroc"] for v in membership["loaded"]["auroc"].values())
    evicted = max(v["auroc"] for v in membership["evicted"]["auroc"].values())
    yield Output(
        value,
        metadata={
            "report": MetadataValue.md(stored["report"]),
            "membership_auroc_loaded": loaded,
            "membership_auroc_evicted": evicted,
            "wmdp_accuracy": wmdp["accuracy"],
            "agent_runtime": MetadataValue.json(runtime),
            "seconds": MetadataValue.json(stored["seconds"]),
            "mlflow_run_id": stored["mlflow_run_id"],
            "reused_unchanged_result": reused,
        },
    )
    yield AssetCheckResult(
        check_name="sample_ran",
        passed=bool(stored["n_scores"] == 3 and wmdp["n"] > 0 and loaded > evicted and runtime.get("restored")),
        metadata={
            "membership_auroc_loaded": loaded,
            "membership_auroc_evicted": evicted,
            "agent_runtime_restored": bool(runtime.get("restored")),
        },
    )


def adapter_assets() -> list:
    return [adapter_zoo, adapter_sample]


adapter_zoo_job = define_asset_job(
    "adapter_zoo_job",
    selection=AssetSelection.assets("adapter_zoo").upstream(),
    executor_def=JOB_EXECUTOR,
    description="Train the LoRA adapter zoo, one adapter per partition (configs/adapter_zoo.yaml), with the data "
    "sets and model it reads (seconds); minutes of CPU per adapter, unchanged adapters reused (`make adapters` "
    "launches every partition, then adapter_study_job).",
)


def adapter_jobs() -> list:
    return [adapter_zoo_job]
