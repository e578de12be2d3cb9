"""Seed 000's adapter study in full (E4-E7 and E1 with adapters) over the trained zoo (``adapter_zoo``, one
partition per adapter, in ``assets.adapters``):

- ``adapter_gate_evaluation``: E4 (lists, projection, output OOD, behaviour) and E5 (influence) over every adapter
  present, AUROC / TPR / FPR per layer with leave-one-out thresholds;
- ``adapter_membership``: E6, the memorising adapter's members vs non-members, loaded vs evicted;
- ``wmdp_cyber_evaluation``: E7, the base model on all 1,987 WMDP-cyber items, and the memorising adapter's halves.
"""

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

from resources import MlflowTrackerResource
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.gate import evaluate_gate, load_gate_config
from rvu_pipelines.adapters.report import gate_markdown
from rvu_pipelines.adapters.study import AdapterLab, influence_summary, scores_frame
from rvu_pipelines.adapters.zoo import load_zoo_config, zoo_root
from rvu_pipelines.adapters.zoo_data import frames_from
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.paths import state_dir
from rvu_pipelines.tracking import metric_name

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

STUDY_GROUP = "adapter_study"
ZOO = "adapter_zoo"  # the partitioned zoo the study reads (one adapter per partition)
GATE_AUROC_GOAL = 0.90  # goal: combined gate AUROC over ≥ 20 real adapters
GATE_SECONDS_GOAL = 10.0  # goal: the gate on one adapter


@asset(
    code_version=CODE_VERSION,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    deps=[ZOO],
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
    frames = frames_from(
        {
            "tofu": tofu,
            "deepset_prompt_injections": deepset_prompt_injections,
            "trustair_jailbreaks": trustair_jailbreaks,
            "awesome_chatgpt_prompts": awesome_chatgpt_prompts,
            "wmdp_cyber": wmdp_cyber,
        }
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
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    deps=[ZOO],
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

    frames = frames_from(
        {
            "tofu": tofu,
            "deepset_prompt_injections": deepset_prompt_injections,
            "trustair_jailbreaks": trustair_jailbreaks,
            "awesome_chatgpt_prompts": awesome_chatgpt_prompts,
        }
    )
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
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    deps=[ZOO],
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
            host, adapter, items, memorised_wmdp_indices(items, frames_from({"wmdp_cyber": wmdp_cyber})), progress=True
        )
    base_all = report["base_all"]
    with mlflow_tracker.run_for(context, params={"items": len(items)}) as run:
        run.log_metrics({k: float(base_all[k]) for k in ("accuracy", "ci_low", "ci_high", "p_value")})
    yield Output(
        report, metadata={"accuracy": base_all["accuracy"], "verdict": base_all["verdict"], "mlflow_run_id": run.run_id}
    )
    yield AssetCheckResult(check_name="wmdp_scored", passed=base_all["n"] == len(items) and len(items) > 0)


def adapter_study_assets() -> list:
    return [adapter_gate_evaluation, adapter_membership, wmdp_cyber_evaluation]
