"""Seed 000's adapter half (E4-E7) as assets over real LoRA adapters (the library is ``rvu_pipelines.adapters``;
the full study is ``scripts/adapter_study.py`` / ``make adapters``):

- ``adapter_zoo``: one partition per adapter of ``configs/adapter_zoo.yaml``, trained with peft on the agent's
  own weights from its data set (lineage from the dataset assets), reused when data and settings are unchanged;
  an MLflow run per training (loss curve, settings, the adapter folder as artifact);
- ``adapter_gate_evaluation``: E4 (lists, projection, output OOD) and E5 (influence) over every adapter present,
  AUROC / TPR / FPR per layer with leave-one-out thresholds;
- ``adapter_membership``: E6, the memorising adapter's members vs non-members, loaded vs evicted;
- ``wmdp_cyber_evaluation``: E7, the base model on all 1,987 WMDP-cyber items, and the memorising adapter's halves;
- ``adapter_sample``: all of it in miniature for the default job (a few steps, a few examples).
"""

from pathlib import Path
from typing import Any

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Failure,
    MetadataValue,
    Output,
    asset,
)

from assets.partitions import adapter_partitions
from resources import MlflowTrackerResource
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.gate import evaluate_gate, load_gate_config
from rvu_pipelines.adapters.report import gate_markdown
from rvu_pipelines.adapters.study import AdapterLab, influence_summary, scores_frame
from rvu_pipelines.adapters.zoo import load_zoo_config, zoo_root
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.paths import state_dir
from rvu_pipelines.tracking import metric_name

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

GROUP = "adapters"
GATE_AUROC_GOAL = 0.90  # goal: combined gate AUROC over ≥ 20 real adapters
GATE_SECONDS_GOAL = 10.0  # goal: the gate on one adapter
TRAIN_SECONDS_GOAL = 300.0  # goal: training one adapter on a 2-core CPU


def _probe_frames(
    tofu: pl.DataFrame, deepset: pl.DataFrame, jailbreaks: pl.DataFrame, roles: pl.DataFrame, **more: pl.DataFrame
) -> Any:
    """The data sets the probe prompts (and most builders) read, under their catalog names."""
    return _frames(
        tofu=tofu,
        deepset_prompt_injections=deepset,
        trustair_jailbreaks=jailbreaks,
        awesome_chatgpt_prompts=roles,
        **more,
    )


def _frames(**frames: pl.DataFrame) -> Any:
    def frame(name: str) -> pl.DataFrame:
        if name not in frames:
            raise KeyError(f"the adapter assets were not given data set '{name}'; add it to their inputs")
        return frames[name]

    return frame


@asset(
    code_version=CODE_VERSION,
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
    frames = _probe_frames(
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


@asset(
    code_version=CODE_VERSION,
    group_name=GROUP,
    kinds={"mlflow"},
    deps=[adapter_zoo],
    description="E4 + E5 over every trained zoo adapter: the three-layer gate (lists; projection against the "
    "refusal reference's weight delta, with Safe-LoRA's similarity beside it; Mahalanobis OOD of output "
    "embeddings on held-out prompts) with per-layer and combined AUROC / TPR / FPR (thresholds leave-one-out "
    "from the other benign adapters), and the gradient-free influence I(e) with its AUROC harmful vs benign.",
    check_specs=[
        AssetCheckSpec("gate_evaluated", asset="adapter_gate_evaluation", blocking=True),
        AssetCheckSpec("gate_auroc_goal", asset="adapter_gate_evaluation"),
        AssetCheckSpec("gate_latency_goal", asset="adapter_gate_evaluation"),
        AssetCheckSpec("influence_ranks_harmful_higher", asset="adapter_gate_evaluation"),
    ],
)
def adapter_gate_evaluation(
    context: AssetExecutionContext,
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    embedder_model: dict,
    tofu: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
    wmdp_cyber: pl.DataFrame,
):
    config, gate = load_zoo_config(), load_gate_config()
    frames = _probe_frames(
        tofu, deepset_prompt_injections, trustair_jailbreaks, awesome_chatgpt_prompts, wmdp_cyber=wmdp_cyber
    )
    lab = AdapterLab.from_records(llm_model, embedder_model, frames)
    try:
        reference = lab.verify(gate.reference_adapter)
    except AdapterRefused as exc:
        raise Failure(f"The gate's safety reference is not usable ({exc}); materialize adapter_zoo for it.") from exc
    present = [e for e in config.adapters if (zoo_root() / e.id / "manifest.json").is_file()]
    missing = sorted(set(e.id for e in config.adapters) - {e.id for e in present})
    if missing:
        context.log.warning("adapters not trained yet (left out): %s", ", ".join(missing))
    scores = [lab.score(lab.verify(entry.id), reference, gate) for entry in present]
    frame = scores_frame(scores)
    evaluation = evaluate_gate([s.gate_scores() for s in scores], gate.false_positive_budget)
    influence = influence_summary(scores)
    with mlflow_tracker.run_for(context, params={"adapters": len(scores), "probes": len(lab.prompts)}) as run:
        for layer, result in evaluation.layers.items():
            run.log_metrics({metric_name(f"{layer}_{k}"): v for k, v in vars(result).items() if isinstance(v, float)})
        run.log_metrics({f"influence_{k}": v for k, v in influence.items()})
    slowest = float(frame["gate_seconds"].max())  # type: ignore[arg-type]
    yield Output(
        {"gate": evaluation.to_dict(), "influence": influence, "scores": frame.to_dicts(), "missing": missing},
        metadata={"report": MetadataValue.md(gate_markdown(evaluation, influence, frame)), "mlflow_run_id": run.run_id},
    )
    combined = evaluation.layers["combined"]
    yield AssetCheckResult(check_name="gate_evaluated", passed=0.0 <= combined.auroc <= 1.0)
    yield AssetCheckResult(
        check_name="gate_auroc_goal",
        passed=bool(combined.auroc >= GATE_AUROC_GOAL and len(scores) >= 20),
        severity=AssetCheckSeverity.WARN,
        metadata={"auroc": combined.auroc, "goal": GATE_AUROC_GOAL, "adapters": len(scores)},
    )
    yield AssetCheckResult(
        check_name="gate_latency_goal",
        passed=bool(slowest <= GATE_SECONDS_GOAL),
        severity=AssetCheckSeverity.WARN,
        metadata={"slowest_seconds": slowest, "goal_seconds": GATE_SECONDS_GOAL},
    )
    yield AssetCheckResult(
        check_name="influence_ranks_harmful_higher",
        passed=bool(influence["auroc"] > 0.5),
        severity=AssetCheckSeverity.WARN,
        metadata={k: float(v) for k, v in influence.items()},
    )


@asset(
    code_version=CODE_VERSION,
    group_name=GROUP,
    kinds={"mlflow"},
    deps=[adapter_zoo],
    description="E6: the memorise-forget adapter (trained on the member half of the TOFU forget set) scored on "
    "all 300 forget questions, members vs non-members (loss, Min-K %, Min-K %++ AUROC with bootstrap CIs, the "
    "direct / semantic / adversarial probes), with the adapter loaded and after it is evicted; the evicted report "
    "and its verdict are the certificate's membership_probe section.",
    check_specs=[
        AssetCheckSpec("membership_loaded_goal", asset="adapter_membership"),
        AssetCheckSpec("membership_evicted_goal", asset="adapter_membership"),
    ],
)
def adapter_membership(
    context: AssetExecutionContext,
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    embedder_model: dict,
    tofu: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
):
    from rvu_pipelines.adapters.eviction import EVICTED_GOAL, LOADED_GOAL, forget_examples, membership_before_after

    frames = _probe_frames(tofu, deepset_prompt_injections, trustair_jailbreaks, awesome_chatgpt_prompts)
    lab = AdapterLab.from_records(llm_model, embedder_model, frames, n_probes=8, n_sensitive=0, n_qa=0)  # no scoring
    try:
        adapter = lab.verify("memorise-forget")
    except AdapterRefused as exc:
        raise Failure(f"memorise-forget is not usable ({exc}); materialize adapter_zoo for it.") from exc
    examples, flags = forget_examples(frames)
    section = membership_before_after(lab.host, adapter, examples, flags, progress=True).certificate_section()
    loaded = {k: v["auroc"] for k, v in section["loaded"]["auroc"].items()}
    evicted = {k: v["auroc"] for k, v in section["evicted"]["auroc"].items()}
    with mlflow_tracker.run_for(
        context, params={"members": int(flags.sum()), "non_members": int((~flags).sum())}
    ) as run:
        run.log_metrics({f"loaded_{k}_auroc": v for k, v in loaded.items()})
        run.log_metrics({f"evicted_{k}_auroc": v for k, v in evicted.items()})
    yield Output(section, metadata={"verdict": section["verdict"], "mlflow_run_id": run.run_id})
    yield AssetCheckResult(
        check_name="membership_loaded_goal",
        passed=bool(max(loaded.values()) >= LOADED_GOAL),
        severity=AssetCheckSeverity.WARN,
        metadata={**loaded, "goal": LOADED_GOAL},
    )
    yield AssetCheckResult(
        check_name="membership_evicted_goal",
        passed=bool(max(evicted.values()) <= EVICTED_GOAL),
        severity=AssetCheckSeverity.WARN,
        metadata={**evicted, "goal": EVICTED_GOAL},
    )


@asset(
    code_version=CODE_VERSION,
    group_name=GROUP,
    kinds={"mlflow"},
    deps=[adapter_zoo],
    description="E7: WMDP-cyber with lm-eval's zero-shot template and letter log-likelihood scoring on all 1,987 "
    "items (accuracy, Wilson 95 % CI, binomial test against 25 %), then the memorise-wmdp adapter: accuracy on the "
    "items it memorised and on an equal seeded control sample of the others, base / loaded / evicted.",
    check_specs=[AssetCheckSpec("wmdp_scored", asset="wmdp_cyber_evaluation", blocking=True)],
)
def wmdp_cyber_evaluation(
    context: AssetExecutionContext,
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    wmdp_cyber: pl.DataFrame,
):
    from rvu_pipelines.adapters.admission import LoadGate
    from rvu_pipelines.adapters.eviction import memorised_wmdp_indices, wmdp_before_after
    from rvu_pipelines.adapters.files import BaseModelInfo, verify_adapter
    from rvu_pipelines.adapters.host import AdapterHost
    from rvu_pipelines.adapters.wmdp import accuracy_report, items_from_frame, score_wmdp
    from rvu_pipelines.models.dequantized import load_dequantized

    items = items_from_frame(wmdp_cyber)
    model, tokenizer = load_dequantized(llm_model["path"], sha256=llm_model["sha256"], attn_implementation="sdpa")
    base = BaseModelInfo.of(model, name=llm_model["name"], sha256=llm_model["sha256"])
    scores = score_wmdp(model, tokenizer, items)
    report: dict[str, Any] = {
        "base_all": accuracy_report(scores.correct, answers=scores.answer).to_dict() | {"truncated": scores.n_truncated}
    }
    try:
        adapter = verify_adapter(zoo_root() / "memorise-wmdp", base)
    except AdapterRefused as exc:
        context.log.warning("memorise-wmdp not usable (%s): only the base accuracy is reported", exc)
    else:
        host = AdapterHost(model, tokenizer, gate=LoadGate.audit(base, state_dir(), config=load_gate_config()))
        report["memorise_wmdp"] = wmdp_before_after(
            host, adapter, items, memorised_wmdp_indices(items, _frames(wmdp_cyber=wmdp_cyber)), progress=True
        )
    base_all = report["base_all"]
    with mlflow_tracker.run_for(context, params={"items": len(items)}) as run:
        run.log_metrics({k: float(base_all[k]) for k in ("accuracy", "ci_low", "ci_high", "p_value")})
    yield Output(
        report, metadata={"accuracy": base_all["accuracy"], "verdict": base_all["verdict"], "mlflow_run_id": run.run_id}
    )
    yield AssetCheckResult(check_name="wmdp_scored", passed=base_all["n"] == len(items) and len(items) > 0)


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
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    embedder_model: dict,
    tofu: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
    wmdp_cyber: pl.DataFrame,
):
    from rvu_pipelines.adapters.sample import SAMPLE_LAB, run_adapter_sample
    from rvu_pipelines.paths import state_dir
    from rvu_pipelines.result_memo import ResultMemo, frame_digest, reuse_message

    inputs = {
        "tofu": tofu,
        "deepset": deepset_prompt_injections,
        "trustair": trustair_jailbreaks,
        "awesome": awesome_chatgpt_prompts,
        "wmdp": wmdp_cyber,
    }
    memo = ResultMemo.default().entry(
        "adapter_sample",
        {
            "llm_sha256": llm_model["sha256"],
            "embedder_sha256": embedder_model["sha256"],
            "frames": {name: frame_digest(frame) for name, frame in inputs.items()},
            "lab": SAMPLE_LAB,
        },
        code=__name__,
    )
    stored = memo.load()
    reused = stored is not None
    if stored is not None:  # nothing it depends on changed since that MLflow run
        context.log.info(reuse_message(stored))
    else:
        frames = _probe_frames(
            tofu, deepset_prompt_injections, trustair_jailbreaks, awesome_chatgpt_prompts, wmdp_cyber=wmdp_cyber
        )
        lab = AdapterLab.from_records(llm_model, embedder_model, frames, **SAMPLE_LAB)
        sample = run_adapter_sample(lab, state_dir() / "adapter_sample", llm_gguf=Path(str(llm_model["path"])))
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
    return [adapter_zoo, adapter_gate_evaluation, adapter_membership, wmdp_cyber_evaluation, adapter_sample]
