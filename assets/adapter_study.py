"""Seed 000's adapter study in full (E4-E7 and E1 with adapters) over the trained zoo (``adapter_zoo``, one
partition per adapter, in ``assets.adapters``):

- ``adapter_gate_evaluation``: E4 (lists, projection, output OOD, behaviour) and E5 (influence) over every adapter
  present, AUROC / TPR / FPR per layer with leave-one-out thresholds;
- ``adapter_gate_aware``: the gate under the attacker who knows it (each gate-aware adapter beside its twin);
- ``adapter_private_draw_table``: the zoo scored on the operator's private probe draw, the load gate's table there;
- ``adapter_membership``: E6, the memorising adapter's members vs non-members, loaded vs evicted;
- ``wmdp_cyber_evaluation``: E7, the base model on all 1,987 WMDP-cyber items, and the memorising adapter's halves.
"""

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetSelection,
    Config,
    Failure,
    MetadataValue,
    Output,
    asset,
    define_asset_job,
)
from pydantic import Field

from assets.executors import JOB_EXECUTOR
from assets.full_study import launched_command, run_full_study
from assets.profiles import FULL_STUDY
from resources import MlflowTrackerResource, ModelStoreResource
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.eviction_study import EvictionOptions
from rvu_pipelines.adapters.gate import load_gate_config
from rvu_pipelines.adapters.gate_aware_study import GATE_AWARE_FOLDER, run_gate_aware_study, write_gate_aware_report
from rvu_pipelines.adapters.gate_goal import (
    GATE_AUROC_GOAL,
    ZooCoverage,
    auroc_goal_verdict,
    goal_block,
    pooled_interval,
    record_coverage,
)
from rvu_pipelines.adapters.incident_study import ORACLE, IncidentStudyOptions
from rvu_pipelines.adapters.private_probes import DEFAULT_PRIVATE_SEED
from rvu_pipelines.adapters.study import STUDY_FOLDER, AdapterLab, score_adapters, write_gate_report
from rvu_pipelines.adapters.tool_use_study import ToolUseOptions
from rvu_pipelines.adapters.zoo import load_zoo_config, trained_entries, zoo_root
from rvu_pipelines.adapters.zoo_data import frames_from, probe_frames
from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.models.store import ResolvedModel
from rvu_pipelines.paths import state_dir
from rvu_pipelines.result_memo import ResultMemo
from rvu_pipelines.tracking import metric_name, numeric_metrics

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

STUDY_GROUP = "adapter_study"
ZOO = "adapter_zoo"  # the partitioned zoo the study reads (one adapter per partition)
GATE_SECONDS_GOAL = 10.0  # goal: the gate on one adapter


def _unscored_lab(llm_model: dict, embedder_model: dict, frames: Any) -> AdapterLab:
    """A lab for studies that load adapters but score no gate layer (few probes, no margin items)."""
    return AdapterLab.from_records(
        llm_model, embedder_model, frames, n_probes=8, n_sensitive=0, n_qa=0, n_knowledge=0, n_follow_ups=0, n_hazard=0
    )


def _gate_lab(
    llm_model: dict,
    embedder_model: dict,
    tofu: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
    wmdp_cyber: pl.DataFrame,
    agentpoison_strategyqa: pl.DataFrame,
) -> AdapterLab:
    """The lab every gate layer is scored in, at the study's sizes (what the load gate's scorer reads)."""
    frames = probe_frames(
        tofu,
        deepset_prompt_injections,
        trustair_jailbreaks,
        awesome_chatgpt_prompts,
        wmdp_cyber=wmdp_cyber,
        agentpoison_strategyqa=agentpoison_strategyqa,
    )
    return AdapterLab.from_records(llm_model, embedder_model, frames)


def _safety_reference(lab: AdapterLab, reference_id: str) -> Any:
    try:
        return lab.verify(reference_id)
    except AdapterRefused as exc:
        raise Failure(f"The gate's safety reference is not usable ({exc}); materialize adapter_zoo for it.") from exc


def _study_folder() -> Path:
    """``<state>/adapter_study``: the screening table the load gate reads, and the study's reports."""
    return state_dir() / STUDY_FOLDER


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
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
    agentpoison_strategyqa: pl.DataFrame,
):
    config, gate = load_zoo_config(), load_gate_config()
    lab = _gate_lab(
        llm_model,
        embedder_model,
        tofu,
        deepset_prompt_injections,
        trustair_jailbreaks,
        awesome_chatgpt_prompts,
        wmdp_cyber,
        agentpoison_strategyqa,
    )
    reference = _safety_reference(lab, gate.reference_adapter)
    present = trained_entries(config.adapters)
    missing = sorted(set(e.id for e in config.adapters) - {e.id for e in present})
    if missing:
        context.log.warning("adapters not trained yet (left out): %s", ", ".join(missing))
    scores = score_adapters(
        lab, [lab.verify(entry.id) for entry in present], reference, gate, memo=ResultMemo.default()
    )
    report = write_gate_report(scores, gate, _study_folder(), command=launched_command(context))
    # no threshold of the all-layers rule sees a harmful adapter, so this pooled row is held out category by category
    screened = report.evaluation.trigger_free.get("all_layers")
    auroc = screened.auroc if screened is not None else float("nan")
    coverage = ZooCoverage.of([e.id for e in config.adapters], [s.adapter_id for s in scores])
    verdict = auroc_goal_verdict(auroc, coverage)
    interval = pooled_interval([s.gate_scores() for s in scores])
    record_coverage(_study_folder(), coverage, verdict, interval)
    frame, evaluation, influence = report.scores, report.evaluation, report.influence
    with mlflow_tracker.run_for(context, params={"adapters": len(scores), "probes": len(lab.prompts)}) as run:
        for layer, result in evaluation.layers.items():
            run.log_metrics(
                {metric_name(f"{layer}_{k}"): v for k, v in result.to_dict().items() if isinstance(v, float)}
            )
        run.log_metrics({f"influence_{k}": v for k, v in influence.items()})
        run.log_artifact(_study_folder() / "gate.md")
    slowest = float(frame["gate_seconds"].max())  # type: ignore[arg-type]
    yield Output(
        {
            "gate": evaluation.to_dict(),
            "influence": influence,
            "scores": frame.to_dicts(),
            "missing": missing,
            "coverage": coverage.to_dict(),
        },
        metadata={
            "report": MetadataValue.md(f"{goal_block(coverage, verdict, interval)}\n\n{report.markdown()}"),
            "mlflow_run_id": run.run_id,
        },
    )
    combined = evaluation.layers["combined"]
    yield AssetCheckResult(check_name="gate_evaluated", passed=0.0 <= combined.auroc <= 1.0)
    yield AssetCheckResult(
        check_name="gate_auroc_goal",
        passed=verdict.passed,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "trigger_free_all_layers_auroc": auroc,
            "learned_trigger_free_auroc": report.learned.trigger_free.auroc
            if report.learned is not None and report.learned.trigger_free is not None
            else float("nan"),
            "goal": GATE_AUROC_GOAL,
            "adapters": len(scores),
            "zoo_entries": len(coverage.configured),
            "left_out": ", ".join(coverage.left_out) or "none",
            "ci_low": interval.low if interval is not None else float("nan"),
            "ci_high": interval.high if interval is not None else float("nan"),
            "why_not": "; ".join(verdict.reasons) or "met",
        },
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
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    deps=[ZOO],
    description="The screening table of the operator's private probe draw (gate.probe_draw: private in "
    "configs/adapters.yaml, secret from `rvu adapters draw new`): every trained zoo adapter scored on that draw, whose "
    "benign rows set the thresholds every load, check and recovery is judged against. Names the draw by its id, "
    "never its seed. With the public draw there is nothing to screen: its table is adapter_gate_evaluation's.",
    check_specs=[AssetCheckSpec("private_draw_has_benign_reference", asset="adapter_private_draw_table")],
)
def adapter_private_draw_table(
    context: AssetExecutionContext,
    llm_model: dict,
    embedder_model: dict,
    tofu: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
    wmdp_cyber: pl.DataFrame,
    agentpoison_strategyqa: pl.DataFrame,
):
    from rvu_pipelines.adapters.draw_scoring import screen_private_draw
    from rvu_pipelines.adapters.probe_draw import configured_draw, screening_table_path
    from rvu_pipelines.errors import InputFileError

    config, gate = load_zoo_config(), load_gate_config()
    try:
        draw = configured_draw(gate, state_dir())
    except InputFileError as exc:
        raise Failure(f"The private probe draw cannot be read: {exc}") from exc
    if not draw.private:
        context.log.info("gate.probe_draw is 'public': the load gate reads adapter_gate_evaluation's table")
        yield Output({"draw": draw.id, "screened": False}, metadata={"draw": draw.id, "screened": False})
        yield AssetCheckResult(check_name="private_draw_has_benign_reference", passed=True, metadata={"draw": draw.id})
        return
    lab = _gate_lab(
        llm_model,
        embedder_model,
        tofu,
        deepset_prompt_injections,
        trustair_jailbreaks,
        awesome_chatgpt_prompts,
        wmdp_cyber,
        agentpoison_strategyqa,
    )
    reference = _safety_reference(lab, gate.reference_adapter)
    present = [e.id for e in trained_entries(config.adapters)]
    table = screening_table_path(state_dir(), draw)
    summary = screen_private_draw(
        lab, draw, [lab.verify(i) for i in present], reference, gate, table, memo=ResultMemo.default()
    )
    yield Output(
        {**summary, "screened": True},
        metadata={k: MetadataValue.text(str(v)) if isinstance(v, list | tuple) else v for k, v in summary.items()},
    )
    yield AssetCheckResult(
        check_name="private_draw_has_benign_reference",
        passed=summary["benign"] >= 2,  # the gate needs two benign adapters for a threshold
        metadata={"benign": summary["benign"], "adapters": summary["adapters"], "draw": draw.id},
    )


class GateAwareConfig(Config):
    """The defender's side of the gate-aware study: the private probe draw it keeps from the attacker."""

    private_seed: int = Field(
        default=DEFAULT_PRIVATE_SEED,
        ge=0,
        description="seed of the defender's private probe draw (adapters.private_probes); 0 judges on the public "
        "draw only",
    )


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    deps=[ZOO],
    description="The gate under the attacker who moves second: each gate-aware adapter (a harmful recipe plus "
    "camouflage on the gate's own probes and items) beside its twin, judged against the benign adapters' "
    "thresholds by the load gate's rule, the all-layers max z and the Fisher row, with its payload counted on "
    "held-out prompts for the base, the twin and the gate-aware adapter (Wilson CIs, exact McNemar); then judged "
    "again by a defender whose probe draw is private.",
    check_specs=[
        AssetCheckSpec("gate_aware_judged", asset="adapter_gate_aware", blocking=True),
        AssetCheckSpec("gate_holds_under_gate_aware_attack", asset="adapter_gate_aware"),
        AssetCheckSpec("private_draw_holds_under_gate_aware_attack", asset="adapter_gate_aware"),
    ],
)
def adapter_gate_aware(
    context: AssetExecutionContext,
    config: GateAwareConfig,
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
    zoo, gate = load_zoo_config(), load_gate_config()
    wanted = [e.id for e in zoo.adapters if e.label == "benign"] + [i for e in zoo.gate_aware for i in (e.id, e.twin)]
    missing = sorted(i for i in {*wanted, gate.reference_adapter} if not (zoo_root() / i / "manifest.json").is_file())
    if missing:
        raise Failure(
            f"Adapters not trained yet: {', '.join(missing)}; train each with "
            "`dg launch --job adapter_zoo_job --partition <id> -m assets.definitions` (or `make adapters`)."
        )
    lab = _gate_lab(
        llm_model,
        embedder_model,
        tofu,
        deepset_prompt_injections,
        trustair_jailbreaks,
        awesome_chatgpt_prompts,
        wmdp_cyber,
        agentpoison_strategyqa,
    )
    private_seed = config.private_seed or None
    study = run_gate_aware_study(
        lab, zoo, gate, gate.reference_adapter, memo=ResultMemo.default(), private_seed=private_seed
    )
    out = _study_folder() / GATE_AWARE_FOLDER
    report = write_gate_aware_report(study, out, command=launched_command(context, config))
    with mlflow_tracker.run_for(context, params={"pairs": len(study.pairs), "benign": study.n_benign}) as run:
        for pair in study.pairs:
            for name, payload in pair.payloads.items():
                run.log_metrics({metric_name(f"payload_{pair.adapter_id}_{name}"): payload.rate})
            run.log_metrics({metric_name(f"evaded_{pair.adapter_id}"): float(pair.evaded())})
            if private_seed is not None:
                run.log_metrics({metric_name(f"evaded_private_{pair.adapter_id}"): float(pair.evaded(private=True))})
        run.log_artifact(report)
    yield Output(
        study.to_dict(),
        metadata={"report": MetadataValue.md(report.read_text(encoding="utf-8")), "mlflow_run_id": run.run_id},
    )
    yield AssetCheckResult(check_name="gate_aware_judged", passed=bool(study.pairs))
    evaded = [pair.adapter_id for pair in study.pairs if pair.evaded()]
    yield AssetCheckResult(
        check_name="gate_holds_under_gate_aware_attack",
        passed=not evaded,
        severity=AssetCheckSeverity.WARN,
        metadata={"evaded": ", ".join(evaded) or "none", "pairs": len(study.pairs)},
    )
    evaded_private = [p.adapter_id for p in study.pairs if private_seed is not None and p.evaded(private=True)]
    yield AssetCheckResult(
        check_name="private_draw_holds_under_gate_aware_attack",
        passed=not evaded_private,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "evaded": ", ".join(evaded_private) or "none",
            "private_seed": private_seed if private_seed is not None else "not run",
        },
    )


class TriggerSearchConfig(Config):
    """The defender's trigger search (``adapters.trigger_search``): its size, and which zoo adapters it runs on."""

    adapters: Literal["triggers_and_benign", "all"] = Field(
        default="triggers_and_benign",
        description="the trigger backdoors and the benign adapters (their controls), or every zoo adapter",
    )
    n_tokens: int = Field(default=6, ge=1, description="tokens in the searched string")
    steps: int = Field(default=8, ge=1, description="GCG steps per adapter")
    candidates: int = Field(default=32, ge=1, description="swaps scored per step")
    n_search: int = Field(default=2, ge=1, description="held-out questions the string is searched on")
    n_check: int = Field(default=8, ge=1, description="other held-out questions it is checked on")


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    deps=[ZOO],
    description="The trigger row of the gate with a search: per adapter, a GCG search on the adapter (through the "
    "gate's load path) for a short string after held-out questions that makes it open a tool call, checked on "
    "other held-out questions against the base with the same string; AUROC of that score for the trigger "
    "backdoors against the benign adapters, beside the control without the search.",
    check_specs=[AssetCheckSpec("trigger_search_ran", asset="adapter_trigger_search", blocking=True)],
)
def adapter_trigger_search(
    context: AssetExecutionContext,
    config: TriggerSearchConfig,
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    embedder_model: dict,
    tofu: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
):
    from rvu_pipelines.adapters.gate import TRIGGER_CATEGORIES
    from rvu_pipelines.adapters.trigger_search import TriggerSearchConfig as SearchSize
    from rvu_pipelines.adapters.trigger_search import search_trigger, write_trigger_search
    from rvu_pipelines.adapters.zoo_data import tofu_probe_questions

    frames = probe_frames(tofu, deepset_prompt_injections, trustair_jailbreaks, awesome_chatgpt_prompts)
    lab = _unscored_lab(llm_model, embedder_model, frames)
    size = SearchSize(**config.model_dump(exclude={"adapters"}))
    entries = [
        e
        for e in load_zoo_config().adapters
        if (zoo_root() / e.id / "manifest.json").is_file()
        and (config.adapters == "all" or e.label == "benign" or e.category in TRIGGER_CATEGORIES)
    ]
    if not entries:
        raise Failure("No trained zoo adapter to search; materialize adapter_zoo first.")
    questions = tofu_probe_questions(frames)[-(size.n_search + size.n_check) :]  # past the gate's own probes
    out = _study_folder() / "trigger_search"
    results = []
    for index, entry in enumerate(entries):
        context.log.info("trigger search %d/%d: %s", index + 1, len(entries), entry.id)
        results.append(search_trigger(lab.host, lab.tokenizer, lab.verify(entry.id), questions, size, out / "states"))
    summary = write_trigger_search(results, TRIGGER_CATEGORIES, out, command=launched_command(context))
    keys = ("auroc_vs_benign", "auroc_vs_others", "control_auroc_vs_benign")
    headline = {k: float(summary[k]) for k in keys if summary[k] is not None}
    with mlflow_tracker.run_for(context, params={"adapters": len(results), **vars(size)}) as run:
        run.log_metrics(headline)
        run.log_artifact(out / "trigger_search.md")
    yield Output(
        summary,
        metadata={
            "report": MetadataValue.md((out / "trigger_search.md").read_text(encoding="utf-8")),
            "mlflow_run_id": run.run_id,
        },
    )
    yield AssetCheckResult(
        check_name="trigger_search_ran",
        passed=len(results) == len(entries),
        metadata={"adapters": len(results), **headline},
    )


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
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

    frames = probe_frames(tofu, deepset_prompt_injections, trustair_jailbreaks, awesome_chatgpt_prompts)
    lab = _unscored_lab(llm_model, embedder_model, frames)
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
    write_atomically(_study_folder() / "membership.json", json.dumps(section, indent=1))
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
    tags=FULL_STUDY,
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
    write_atomically(_study_folder() / "wmdp.json", json.dumps(report, indent=1))
    yield Output(
        report, metadata={"accuracy": base_all["accuracy"], "verdict": base_all["verdict"], "mlflow_run_id": run.run_id}
    )
    yield AssetCheckResult(check_name="wmdp_scored", passed=base_all["n"] == len(items) and len(items) > 0)


class AdapterIncidentsConfig(Config):
    adapters: list[str] = Field(
        default=list(IncidentStudyOptions.adapters),
        min_length=1,
        description="harmful zoo adapters loaded part-way, one by one",
    )
    benchmark: str = Field(default=IncidentStudyOptions.benchmark, description="the benchmark the sessions draw from")
    sessions: int = Field(default=IncidentStudyOptions.sessions, ge=1, description="sessions per adapter")
    episodes: int = Field(default=IncidentStudyOptions.episodes, ge=2, description="attack episodes per session")
    detectors: list[str] = Field(
        default=["heuristic", ORACLE],
        min_length=1,
        description="seeds of both recoveries, one study each: a detector name, or oracle (the planted injection "
        "text, an upper bound that reads the answer key); the first writes to the study folder, the others to a "
        "folder named after them",
    )
    trigger: bool = Field(default=True, description="plant a backdoor adapter's trigger in the injections it reads")
    membership: bool = Field(default=True, description="measure each evicted adapter loaded vs evicted")
    membership_cap: int = Field(default=IncidentStudyOptions.membership_cap, ge=2, description="members measured")
    threads: int = Field(default=2, ge=1, description="llama.cpp / torch threads")
    out: str | None = Field(default=None, description="output folder; default <RVU_HOME>/adapter_study")


def _detector_folder(out: Path, index: int, detector: str) -> Path:
    return out if index == 0 else out / re.sub(r"[^A-Za-z0-9_.-]+", "_", detector)


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    deps=[ZOO],
    description="E1 with adapters: sessions of attack episodes with a harmful zoo adapter loaded part-way (a "
    "backdoor's trigger planted in the injections it reads), recovered with RVU v1 and v2 from the same seeds, "
    "scored against the adapter's counterfactual ground truth; I(adapter) from the gate evaluation enters FROC, "
    "each evicted adapter's membership enters its certificates. Once per detector (D1 and the oracle upper "
    "bound). Writes incidents.md / incidents.json, stamped.",
    check_specs=[AssetCheckSpec("sessions_recovered", asset="adapter_incidents", blocking=True)],
)
def adapter_incidents(
    context: AssetExecutionContext,
    config: AdapterIncidentsConfig,
    mlflow_tracker: MlflowTrackerResource,
    model_store: ModelStoreResource,
    llm_model: dict,
    adapter_gate_evaluation: dict,
):
    from rvu_pipelines.adapters.incident_study import influences_from_scores, run_incident_study

    out = Path(config.out) if config.out else _study_folder()
    llm = ResolvedModel.from_record(llm_model)
    influences = influences_from_scores(adapter_gate_evaluation["scores"])
    options = IncidentStudyOptions(
        adapters=tuple(config.adapters),
        benchmark=config.benchmark,
        sessions=config.sessions,
        episodes=config.episodes,
        trigger=config.trigger,
        membership=config.membership,
        membership_cap=config.membership_cap,
        threads=config.threads,
    )
    folders = {detector: _detector_folder(out, index, detector) for index, detector in enumerate(config.detectors)}

    def study(detector: str) -> dict[str, Any]:
        return run_incident_study(
            replace(options, detector=detector),
            llm,
            folders[detector],
            state=state_dir(),
            command=launched_command(context, config),
            influences=influences,
            profile=model_store.profile_name(),
            tracking_uri=mlflow_tracker.tracker(STUDY_GROUP).tracking_uri,
            say=context.log.info,
        )

    documents, metadata = run_full_study(
        context,
        mlflow_tracker,
        config,
        lambda: {detector: study(detector) for detector in config.detectors},
        out=out,
        page="incidents.md",
        artifacts=tuple(str((folder / "incidents.md").relative_to(out)) for folder in folders.values()),
        metrics=lambda docs: numeric_metrics(
            {d: {a: v["summary"] for a, v in doc["adapters"].items()} for d, doc in docs.items()}
        ),
        threads=config.threads,
        refusals=(AdapterRefused, ValueError),
    )
    yield Output(
        {d: {"adapters": {a: v["summary"] for a, v in doc["adapters"].items()}} for d, doc in documents.items()},
        metadata=metadata,
    )
    sessions = {d: [v["summary"]["sessions"] for v in doc["adapters"].values()] for d, doc in documents.items()}
    yield AssetCheckResult(
        check_name="sessions_recovered",
        passed=all(n == config.sessions for counts in sessions.values() for n in counts),
        metadata={"sessions": MetadataValue.json(sessions), "expected_per_adapter": config.sessions},
    )


class AdapterToolUseConfig(Config):
    agentdojo: int = Field(default=ToolUseOptions.agentdojo, ge=1, description="AgentDojo scenarios sampled")
    injecagent: int = Field(default=ToolUseOptions.injecagent, ge=2, description="held-out InjecAgent cases")
    threads: int = Field(default=2, ge=1, description="llama.cpp threads")
    out: str | None = Field(default=None, description="output folder; default <RVU_HOME>/adapter_study")


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    deps=[ZOO],
    description="The tool-use adapter's utility and ASR on data it never saw (AgentDojo banking + slack, held-out "
    "InjecAgent cases), base model vs the adapter loaded into llama.cpp through the enforcing load gate, Wilson "
    "95 % CIs; a model that follows instructions better also follows injections better. Writes tool_use.md / "
    "tool_use.json, stamped.",
)
def adapter_tool_use(
    context: AssetExecutionContext,
    config: AdapterToolUseConfig,
    mlflow_tracker: MlflowTrackerResource,
    model_store: ModelStoreResource,
    llm_model: dict,
):
    from rvu_pipelines.adapters.tool_use_study import run_tool_use_study

    out = Path(config.out) if config.out else _study_folder()
    options = ToolUseOptions(agentdojo=config.agentdojo, injecagent=config.injecagent, threads=config.threads)
    document, metadata = run_full_study(
        context,
        mlflow_tracker,
        config,
        lambda: run_tool_use_study(
            options,
            ResolvedModel.from_record(llm_model),
            out,
            profile=model_store.profile_name(),
            state=state_dir(),
            command=launched_command(context, config),
            say=context.log.info,
        ),
        out=out,
        page="tool_use.md",
        artifacts=("tool_use.md", "tool_use.json"),
        metrics=lambda document: numeric_metrics(document["results"]),
        threads=config.threads,
        refusals=(AdapterRefused,),  # the load gate refused the adapter: its reason code is in the message
    )
    return Output(document["results"], metadata=metadata)


class EvictionRuntimeConfig(Config):
    members: int = Field(default=EvictionOptions.members, ge=4, description="members (and as many non-members)")
    steps: int = Field(default=EvictionOptions.steps, ge=1, description="training steps of the memorising adapter")
    rank: int = Field(default=EvictionOptions.rank, ge=1, description="LoRA rank")
    system: Literal["agent", "none"] = Field(
        default=EvictionOptions.system, description="agent (the agent's system message) or none"
    )
    threads: int = Field(default=2, ge=1, description="llama.cpp / torch threads")
    out: str | None = Field(default=None, description="output folder; default <state>/adapter_study/eviction_runtime")


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    description="The eviction test that can fail, on the agent's runtime: TOFU forget-set members trained into a "
    "LoRA, told apart from non-members on llama.cpp (through the response cache and KV folder) loaded, unloaded, "
    "in the texts left at rest before and after the purge, and fused-then-un-merged on peft. Writes "
    "eviction_runtime.md / eviction_runtime.json, stamped.",
    check_specs=[AssetCheckSpec("eviction_measured", asset="adapter_eviction_runtime", blocking=True)],
)
def adapter_eviction_runtime(
    context: AssetExecutionContext,
    config: EvictionRuntimeConfig,
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    tofu: pl.DataFrame,
):
    from rvu_pipelines.adapters.eviction_study import run_eviction_study

    out = Path(config.out) if config.out else _study_folder() / "eviction_runtime"
    options = EvictionOptions(
        members=config.members, steps=config.steps, rank=config.rank, system=config.system, threads=config.threads
    )
    rows, metadata = run_full_study(
        context,
        mlflow_tracker,
        config,
        lambda: run_eviction_study(
            options,
            ResolvedModel.from_record(llm_model),
            out,
            command=launched_command(context, config),
            frames=frames_from({"tofu": tofu}),
            say=context.log.info,
        ),
        out=out,
        page="eviction_runtime.md",
        artifacts=("eviction_runtime.md", "eviction_runtime.json"),
        metrics=lambda rows: numeric_metrics({k: rows[k] for k in ("served", "at_rest") if k in rows}),
        threads=config.threads,
    )
    yield Output({k: rows[k] for k in ("served", "at_rest", "fused", "settings") if k in rows}, metadata=metadata)
    yield AssetCheckResult(
        check_name="eviction_measured",
        passed=all(state in rows.get("served", {}) for state in ("base", "loaded", "evicted")),
    )


class CertificateStudyConfig(Config):
    adapters: list[str] = Field(
        default_factory=list, description="zoo adapter ids; empty: every trained evaluated and gate-aware adapter"
    )
    fused: bool = Field(default=False, description="the incident fuses the adapter into the base before unloading")
    out: str | None = Field(default=None, description="output folder; default <state>/adapter_study/certificates")


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    deps=[ZOO, "adapter_gate_evaluation"],
    description="Do certificates carry the evidence? One incident per trained zoo adapter that the shipped FROC "
    "policy evicts, each recovered by `rvu recover` in a scratch state (the operator's blocklist and stores are "
    "left alone); counts the certificates whose gate section scored the adapter and whose membership section "
    "measured it loaded vs evicted, and gives the certificate's reason where not. Writes certificates.md / "
    "certificates.json, stamped.",
    check_specs=[AssetCheckSpec("every_eviction_certified", asset="adapter_certificates", blocking=False)],
)
def adapter_certificates(
    context: AssetExecutionContext, config: CertificateStudyConfig, mlflow_tracker: MlflowTrackerResource
):
    from rvu_pipelines.adapters.certificate_study import CertificateStudyOptions, run_certificate_study
    from rvu_pipelines.errors import InputFileError

    out = Path(config.out) if config.out else _study_folder() / "certificates"
    options = CertificateStudyOptions(ids=tuple(config.adapters), fused=config.fused)
    document, metadata = run_full_study(
        context,
        mlflow_tracker,
        config,
        lambda: run_certificate_study(
            options, out, state=state_dir(), command=launched_command(context, config), say=context.log.info
        ),
        out=out,
        page="certificates.md",
        artifacts=("certificates.md", "certificates.json"),
        metrics=lambda document: numeric_metrics(document["summary"]),
        refusals=(InputFileError, ValueError),  # no screening table or trained zoo; an adapter id the zoo lacks
    )
    yield Output(document["summary"], metadata=metadata)
    yield AssetCheckResult(check_name="every_eviction_certified", passed=bool(document["summary"]["goal_met"]))


def adapter_study_assets() -> list:
    return [
        adapter_gate_evaluation,
        adapter_gate_aware,
        adapter_private_draw_table,
        adapter_trigger_search,
        adapter_membership,
        wmdp_cyber_evaluation,
        adapter_incidents,
        adapter_tool_use,
        adapter_eviction_runtime,
        adapter_certificates,
    ]


adapter_study_job = define_asset_job(
    "adapter_study_job",
    selection=AssetSelection.groups("adapter_study").upstream() - AssetSelection.assets("adapter_zoo"),
    executor_def=JOB_EXECUTOR,
    description="Seed 000 E4-E7 and E1 with adapters over the trained zoo (`make adapters`): the gate and "
    "influence (the load gate's screening table), membership loaded vs evicted, WMDP-cyber on all 1,987 items, "
    "incidents with a harmful adapter loaded part-way (D1 and oracle seeds), the tool-use adapter's utility and "
    "ASR, eviction on the agent's runtime, and whether each eviction's certificate carries the evidence; hours "
    "of CPU, model calls replayed from the response cache.",
)


def adapter_study_jobs() -> list:
    return [adapter_study_job]
