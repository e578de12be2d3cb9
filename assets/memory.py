"""The memory reference monitor (seed 002 §3-4) evaluated as an asset: Tables 6-7 on real payloads."""

import polars as pl
from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, MetadataValue, Output, asset

from resources import MlflowTrackerResource
from rvu_pipelines.detectors.corpora import CORPUS_NAMES, build_corpus
from rvu_pipelines.memory import evaluate_monitor

CHECKS = [
    "payloads_all_blocked",
    "attack_vectors_blocked_by_named_rule",
    "zero_cross_session_leaks",
    "soul_md_sha256_unchanged",
    "zero_untrusted_modifications",
    "theorem_part_i",
    "theorem_part_ii",
    "theorem_part_iii",
    "audit_chain_verifies",
    "audit_tamper_detected",
]


def injection_test_payloads(datasets: dict[str, pl.DataFrame]) -> list[str]:
    """Every injection-labelled test payload of the detector corpora, deduplicated and sorted."""
    texts: set[str] = set()
    for name in CORPUS_NAMES:
        test = build_corpus(name, datasets).part("test")
        texts.update(test.filter(pl.col("label") == 1)["text"].to_list())
    return sorted(texts)


@asset(
    group_name="memory",
    kinds={"duckdb", "mlflow"},
    description="Seed 002 Tables 6-7: every injection-labelled test payload of the detector corpora sent through "
    "untrusted channels, attack vectors A1-A7, 50 sessions with 2,450 ordered pair checks, SOUL.md sha256, "
    "Theorem 1 Parts I-III over the whole execution, and the hash-chained audit log (with a tamper test).",
    check_specs=[AssetCheckSpec(name, asset="memory_monitor_evaluation", blocking=True) for name in CHECKS],
)
def memory_monitor_evaluation(
    context: AssetExecutionContext,
    mlflow_tracker: MlflowTrackerResource,
    deepset_prompt_injections: pl.DataFrame,
    trustair_jailbreaks: pl.DataFrame,
    awesome_chatgpt_prompts: pl.DataFrame,
):
    payloads = injection_test_payloads(
        {
            "deepset_prompt_injections": deepset_prompt_injections,
            "trustair_jailbreaks": trustair_jailbreaks,
            "awesome_chatgpt_prompts": awesome_chatgpt_prompts,
        }
    )
    with mlflow_tracker.run_for(context, params={"payloads": len(payloads), "sessions": 50}) as run:
        result = evaluate_monitor(payloads, n_sessions=50)
        report = result.to_dict()
        run.log_metrics(
            {
                "payloads": report["payloads"]["n"],
                "payloads_blocked": report["payloads"]["blocked"],
                "vectors_blocked": result.vectors_blocked,
                "pair_checks": report["isolation"]["pair_checks"],
                "leaks": report["isolation"]["leaks"],
                "audit_records": report["audit"]["records"],
                **{f"check_{k}": float(v) for k, v in report["checks"].items()},
            }
        )
    yield Output(
        report,
        metadata={
            "tables_6_7": MetadataValue.md(result.markdown()),
            "payloads": len(payloads),
            "mlflow_run_id": run.run_id,
        },
    )
    for name, passed in sorted(result.checks().items()):
        yield AssetCheckResult(check_name=name, passed=passed)


def memory_assets() -> list:
    return [memory_monitor_evaluation]
