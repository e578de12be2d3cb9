"""The attack table over held-out scenarios (benchmark × attack × defense), paired between defenses.

Thin wrapper over rvu_pipelines.attacks.study: every cell is resumable (finished episodes are reused), one MLflow
run per cell, the table and its paired comparisons as metadata, checked against the committed golden table.
Optimised strings are read from configs/attacks (checked against the agent's weights), never re-optimised here.
"""

from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSelection,
    MetadataValue,
    Output,
    asset,
    define_asset_job,
)
from pydantic import Field

from assets.attacks import GROUP, HarnessConfig, log_attack_cell, open_harness
from assets.executors import JOB_EXECUTOR
from assets.production_detector import KEY as PRODUCTION_ASSET
from assets.profiles import FULL_STUDY
from resources import LLMResource, MlflowTrackerResource, ModelStoreResource
from rvu_pipelines.agents.evaluation import attack_table
from rvu_pipelines.agents.regression import (
    compare_on_the_same_sample,
    drift_markdown,
    golden_full_path,
    load_golden,
    load_tolerance,
)
from rvu_pipelines.atomic_write import atomic_path
from rvu_pipelines.attacks.paired import paired_attack_tests, paired_defense_tests
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.machine import write_stamp
from rvu_pipelines.paths import config_dir, state_dir
from rvu_pipelines.redteam.table import (
    CONTROLS,
    TablePlan,
    best_of_attacks,
    episode_rows,
    gate_reach_rows,
    per_scenario_cells,
    run_table,
    study_markdown,
    transfer_summary,
)
from rvu_pipelines.scenarios.axes import ATTACKS, DEFENSES

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

SMALL_BENCHMARKS = ["injecagent_dh", "injecagent_ds", "bipia_email", "agentdojo"]


class AttackTableConfig(HarnessConfig):
    benchmarks: list[str] = Field(default=SMALL_BENCHMARKS, description="Benchmarks (rows of the table).")
    attacks: list[str] = Field(default=list(ATTACKS), description="Attacks (native, controls, optimised, adaptive).")
    defenses: list[str] = Field(default=list(DEFENSES), description="Defenses (columns).")
    per_benchmark: int = Field(
        default=5, description="Held-out scenarios per benchmark (fixed seed; the published table uses >= 100)."
    )
    name: str = Field(
        default="heldout",
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="The run's folder under <RVU_HOME>/attacks/full/<profile>/ (lower case, digits, _ and -): each "
        "run config names its own, so the tables of two configs are both kept.",
    )
    sample: str = Field(
        default="heldout",
        description="heldout: per_benchmark held-out scenarios; per_scenario: every row on the scenarios that have a "
        "per-scenario string (so its controls are paired with it).",
    )


def run_command(name: str) -> str:
    """The command that makes the table of run ``name``: its run config under configs/runs when there is one."""
    for config in (config_dir() / "runs" / f"attacks_{name}.yaml", config_dir() / "runs" / f"{name}.yaml"):
        if config.is_file() and "attack_table_full" in config.read_text(encoding="utf-8"):
            return f"make attacks ATTACKS_CONFIG=configs/runs/{config.name}"
    return f"make attacks (attack_table_full config name: {name})"


def _golden_check(table: pl.DataFrame, profile: str) -> AssetCheckResult:
    path = golden_full_path(profile)
    try:
        golden = load_golden(path)
    except ConfigError as exc:
        return AssetCheckResult(
            check_name="matches_golden_full",
            passed=False,
            severity=AssetCheckSeverity.WARN,
            metadata={"reason": str(exc), "golden": str(path)},
        )
    result = compare_on_the_same_sample(table, golden, load_tolerance())
    return AssetCheckResult(
        check_name="matches_golden_full",
        passed=not result.drifts,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "golden": str(path),
            "cells_compared": len(result.compared),
            "cells_on_another_sample_size": MetadataValue.json(result.other_sample_size),
            "cells_not_in_golden": MetadataValue.json(result.not_in_golden),
            "drifts": MetadataValue.md(drift_markdown(result.drifts)),
        },
    )


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=GROUP,
    deps=[PRODUCTION_ASSET],
    kinds={"llama_cpp", "mlflow"},
    description="The attack table on held-out scenarios: every benchmark × attack (no_attack and random_string "
    "controls, native, forged_turn, the GCG universal string, the attack adapted to each defense) × defense on the "
    "same fixed-seed sample per benchmark, Wilson CIs, paired exact McNemar between defenses (Holm-corrected), the "
    "defenses that win by refusing named. Resumable; `make attacks`.",
    check_specs=[
        AssetCheckSpec(
            "matches_golden_full",
            asset="attack_table_full",
            description="Every cell present in configs/golden/table1_full_<profile>.json within tolerance.",
        )
    ],
)
def attack_table_full(
    context: AssetExecutionContext,
    config: AttackTableConfig,
    llm_model: dict,
    llm: LLMResource,
    model_store: ModelStoreResource,
    mlflow_tracker: MlflowTrackerResource,
):
    plan = TablePlan(
        tuple(config.benchmarks), tuple(config.attacks), tuple(config.defenses), config.per_benchmark, config.sample
    )
    harness = open_harness(config, llm_model, llm, model_store, mlflow_tracker)
    runs, skipped = run_table(harness, plan, progress=config.progress)
    run_ids = [log_attack_cell(context, mlflow_tracker, harness, run, llm_model) for run in runs]
    table = attack_table(runs)
    rows = episode_rows(runs)
    paired = paired_defense_tests(rows)
    against_controls = paired_attack_tests(rows, CONTROLS) if rows.height else None
    transfer_dir = state_dir() / "attacks" / "transfer"  # scripts/universal_transfer.py
    transfer = transfer_summary(runs, per_scenario_cells(plan, harness.attack_context, transfer_dir))
    markdown = study_markdown(
        table,
        paired,
        skipped,
        transfer,
        against_controls,
        gate_reach_rows(plan, harness.gate_check()),
        best_of_attacks(rows),
    )
    folder = state_dir() / "attacks" / "full" / harness.profile / config.name
    folder.mkdir(parents=True, exist_ok=True)
    for name, frame in (("table.parquet", table), ("paired.parquet", paired)):
        with atomic_path(folder / name) as temp:
            frame.write_parquet(temp)
    (folder / "table.md").write_text(markdown + "\n", encoding="utf-8")
    write_stamp(folder, run_command(config.name))  # rvu report's header: command, commit, date, machine
    context.log.info(markdown)
    yield _output(table, paired, markdown, run_ids, skipped, folder)
    yield _golden_check(table, harness.profile)


def _output(
    table: pl.DataFrame, paired: pl.DataFrame, markdown: str, run_ids: list[str], skipped: list, folder: Path
) -> Output:
    return Output(
        table,
        metadata={
            "folder": str(folder),
            "dagster/row_count": table.height,
            "table": MetadataValue.md(markdown),
            "paired_comparisons": paired.height,
            "significant_pairs": int(paired["significant"].sum()) if paired.height else 0,
            "cells_not_run": MetadataValue.json(skipped),
            "mlflow_cell_run_ids": MetadataValue.json(run_ids),
        },
    )


def attack_study_assets() -> list[AssetsDefinition]:
    return [attack_table_full]


attack_table_job = define_asset_job(
    "attack_table_job",
    # with what it reads (the agent's model, the classifier's detector and the data they come from; each is reused
    # once stored), so a clean checkout runs it too
    selection=AssetSelection.assets("attack_table_full").upstream(),
    executor_def=JOB_EXECUTOR,
    description="The attack table on held-out scenarios: benchmark × attack × defense with controls, the GCG "
    "universal string and the adaptive attacks, paired comparisons (`make attacks`; config `per_benchmark`).",
)


def attack_study_jobs() -> list:
    return [attack_table_job]
