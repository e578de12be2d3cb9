"""The memory reference monitor (seed 002 §3-4) evaluated as an asset: Tables 6-7 on real payloads."""

import polars as pl
from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, Config, MetadataValue, Output, asset
from pydantic import Field

from assets.production_detector import KEY as PRODUCTION_ASSET
from resources import MlflowTrackerResource
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.detectors.catalog import PRODUCTION_CHOICE, content_check_for
from rvu_pipelines.detectors.corpora import CORPUS_NAMES, build_corpus
from rvu_pipelines.memory import evaluate_monitor
from rvu_pipelines.memory.user_channel import ContentCheck, RegexContentCheck
from rvu_pipelines.memory.utility_cost import strategyqa_records
from rvu_pipelines.result_memo import ResultMemo, frame_digest, reuse_message

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

UTILITY_WORKLOAD = "AgentPoison ReAct-StrategyQA memory"

CHECKS = [
    "payloads_all_blocked",
    "attack_vectors_blocked_by_named_rule",
    "zero_cross_session_leaks",
    "own_reads_ok",
    "soul_md_sha256_unchanged",
    "zero_untrusted_modifications",
    "theorem_part_i",
    "theorem_part_ii",
    "theorem_part_iii",
    "audit_chain_verifies",
    "audit_tamper_detected",
    "benign_user_writes_accepted",
]


REGEX_CHECK = "regex"


class MonitorEvaluationConfig(Config):
    content_check: str = Field(
        default=PRODUCTION_CHOICE,
        description="The USER channel's advisory content check: production (rvu-injection-detector@production from "
        "the tracker's registry, flagged at its calibrated 0.5), regex (the library's small pattern list), "
        "nanoguard, heuristic or registered:<name>[@<alias>].",
    )


def user_content_check(choice: str, tracking_uri: str) -> ContentCheck:
    """The content check ``choice`` names; registered detectors come from ``tracking_uri``'s registry."""
    return RegexContentCheck() if choice == REGEX_CHECK else content_check_for(choice, tracking_uri)


def corpus_test_texts(datasets: dict[str, pl.DataFrame]) -> tuple[list[str], list[str]]:
    """(injection payloads, benign texts): every test text of the detector corpora with that label, deduplicated
    and sorted. Each corpus is built once for both labels (its near-duplicate split is most of the cost)."""
    texts: dict[int, set[str]] = {0: set(), 1: set()}
    for name in CORPUS_NAMES:
        test = build_corpus(name, datasets).part("test")
        for label, found in texts.items():
            found.update(test.filter(pl.col("label") == label)["text"].to_list())
    return sorted(texts[1]), sorted(texts[0])


def memory_metrics(report: dict) -> dict[str, float]:
    """The MLflow metrics of one evaluation: what the payload count means sits next to it."""
    benign, utility = report["benign"] or {}, report["utility"] or {}
    return {
        "payloads": report["payloads"]["n"],
        "payloads_blocked": report["payloads"]["blocked"],  # by the untrusted-channel rule, by construction
        "benign_texts": benign.get("n", 0),
        "benign_blocked_untrusted": benign.get("blocked_untrusted", 0),  # same channels: blocked by design
        "benign_accepted_user": benign.get("accepted_user", 0),
        "benign_flagged_user": benign.get("flagged_on_user_channel", 0),
        "utility_writes": utility.get("writes", 0),
        "utility_need_user": utility.get("need_user", 0),
        "utility_accepted_direct": utility.get("accepted_direct", 0),
        "utility_promotions_needed": utility.get("promotions_needed", 0),
        "utility_promotions_rate_limited": utility.get("promotions_rate_limited", 0),
        "pair_checks": report["isolation"]["pair_checks"],
        "leaks": report["isolation"]["leaks"],
        "own_reads_ok": report["isolation"]["own_reads_ok"],
        "audit_records": report["audit"]["records"],
        **{f"check_{k}": float(v) for k, v in report["checks"].items()},
    }


@asset(
    code_version=CODE_VERSION,
    group_name="memory",
    deps=[PRODUCTION_ASSET],
    kinds={"duckdb", "mlflow"},
    description="Seed 002 Tables 6-7: every injection-labelled test payload of the detector corpora sent through "
    "untrusted channels (blocked by the channel rule whatever the text, so the count is true by construction), "
    "the benign test texts of the same corpora through the same channels (blocked too, by design) and through "
    "the USER channel (accepted; the content check, by default the production detector, flags without blocking), "
    "the utility cost on the AgentPoison ReAct-StrategyQA memory (records that "
    "need a USER endorsement / promotion), attack vectors A1-A7, 50 sessions with 2,450 ordered pair checks "
    "and own reads, SOUL.md sha256, Theorem 1 Parts I-III over the whole execution, and the hash-chained "
    "audit log (with a tamper test).",
    check_specs=[AssetCheckSpec(name, asset="memory_monitor_evaluation", blocking=True) for name in CHECKS],
)
def memory_monitor_evaluation(
    context: AssetExecutionContext,
    config: MonitorEvaluationConfig,
    mlflow_tracker: MlflowTrackerResource,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
    agentpoison_strategyqa: pl.DataFrame,
):
    datasets = {
        "deepset_prompt_injections": deepset_prompt_injections,
        "trustair_jailbreaks": trustair_jailbreaks,
        "awesome_chatgpt_prompts": awesome_chatgpt_prompts,
    }
    frames = {name: frame_digest(frame) for name, frame in {**datasets, "strategyqa": agentpoison_strategyqa}.items()}
    content_check = user_content_check(config.content_check, mlflow_tracker.tracker("memory").tracking_uri)
    memo = ResultMemo.default().entry(
        "memory_monitor_evaluation",
        {"frames": frames, "workload": UTILITY_WORKLOAD, "sessions": 50, "content_check": content_check.name},
        code=__name__,
    )
    stored = memo.load()
    reused = stored is not None
    if stored is not None:  # nothing it depends on changed since that MLflow run
        context.log.info(reuse_message(stored))
    else:
        payloads, benign = corpus_test_texts(datasets)
        records = strategyqa_records(agentpoison_strategyqa.filter(pl.col("split") == "train").to_dicts())
        params = {
            "payloads": len(payloads),
            "benign": len(benign),
            "utility_records": len(records),
            "sessions": 50,
            "content_check": content_check.name,
        }
        with mlflow_tracker.run_for(context, params=params) as run:
            result = evaluate_monitor(
                payloads,
                benign=benign,
                utility_records=records,
                utility_workload=UTILITY_WORKLOAD,
                n_sessions=50,
                content_check=content_check,
            )
            report = result.to_dict()
            run.log_metrics({**memory_metrics(report), "vectors_blocked": result.vectors_blocked})
        stored = memo.save(
            {
                "report": report,
                "markdown": result.markdown(),
                "checks": result.checks(),
                "mlflow_run_id": run.run_id,
                "n_payloads": len(payloads),
            }
        )
    report = stored["report"]
    p, b, u = report["payloads"], report["benign"], report["utility"]
    yield Output(
        report,
        metadata={
            "tables_6_7": MetadataValue.md(stored["markdown"]),
            "payloads": stored["n_payloads"],
            "payloads_blocked": f"{p['blocked']}/{p['n']}: blocked by the untrusted-channel rule "
            "(true by construction)",
            "benign_blocked_untrusted": f"{b['blocked_untrusted']}/{b['n']}: benign texts, same untrusted channels "
            "(blocked by design)",
            "benign_accepted_user": f"{b['accepted_user']}/{b['n']}: the same texts through the USER channel "
            f"({b['flagged_on_user_channel']} flagged by the advisory content check {content_check.name})",
            "content_check": content_check.name,
            "utility_cost": f"{u['need_user']}/{u['writes']} legitimate memory writes of the {UTILITY_WORKLOAD} run "
            f"need a USER endorsement; {u['promotions_needed']} need a USER promotion to reach shared memory "
            f"({u['promotions_rate_limited']} rate-limited at {u['max_promotions_per_window']} per "
            f"{u['promotion_window_s']:.0f} s, one episode per {u['episode_seconds']:.0f} s)",
            "own_reads_ok": f"{report['isolation']['own_reads_ok']}/{report['isolation']['n_sessions']}",
            "mlflow_run_id": stored["mlflow_run_id"],
            "reused_unchanged_result": reused,
        },
    )
    for name, passed in sorted(stored["checks"].items()):
        yield AssetCheckResult(check_name=name, passed=bool(passed))


def memory_assets() -> list:
    return [memory_monitor_evaluation]
