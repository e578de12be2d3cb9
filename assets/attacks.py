"""Attack harness assets (seed 000 E1, Table 1): cells of benchmark × attack × defense on the profile's LLM.

- ``attack_cell``: partitioned by benchmark × arm (an arm is ``<attack>.<defense>``: Dagster takes two
  dimensions at most), so any cell of any size can be materialized or backfilled from the UI;
- ``attack_table_1``: the canonical 10 scenarios under the configured attacks (config ``attacks``, default
  the benchmarks' own injections) and all eight defenses (Table 1), checked against the committed golden
  results — the nightly regression sweep runs it, re-running every episode against the current code
  (config ``rerun``, forced by the sweep's run tag ``rvu/sweep=nightly``);
- ``attack_benchmark_samples``: a fixed-seed sample of each benchmark under the configured attacks and all
  eight defenses.

Thin wrappers over rvu_pipelines.agents; every cell is one MLflow run, tagged (like every row and the
table) with the code version that produced it.
"""

import base64
from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSelection,
    Config,
    MetadataValue,
    MultiPartitionKey,
    MultiPartitionsDefinition,
    Output,
    StaticPartitionsDefinition,
    asset,
    define_asset_job,
)
from pydantic import Field

from assets.executors import JOB_EXECUTOR
from assets.production_detector import KEY as PRODUCTION_ASSET  # the classifier defense's default detector
from assets.profiles import FULL_STUDY, NIGHTLY_ONLY
from resources import LLMResource, MlflowTrackerResource, ModelStoreResource
from rvu_pipelines.agents.evaluation import CellRun, attack_table, plot_attack_table, table_markdown
from rvu_pipelines.agents.harness import AGENT_N_CTX, Harness
from rvu_pipelines.agents.regression import (
    asr_against_golden,
    compare_to_golden,
    drift_markdown,
    drifts_as_dicts,
    golden_full_path,
    golden_path,
    golden_subset,
    load_golden,
    load_tolerance,
    rate_comparison_markdown,
    regression_sweep,
    table_code_version,
)
from rvu_pipelines.attacks.catalog import get_attack
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.code_version import code_version
from rvu_pipelines.detectors.catalog import PRODUCTION_CHOICE
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import state_dir
from rvu_pipelines.redteam.table import cell_scenarios, heldout_sample, unavailable
from rvu_pipelines.scenarios.axes import ATTACKS, BENCHMARKS, CANONICAL, DEFENSES, NATIVE, SWEEP_BENCHMARKS

RATES_CHECK = "asr_matches_golden_full"
CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

ARM_SEPARATOR = "."  # Dagster refuses "|", ",", "[" and "]" in a dimension's keys; no attack or defense has a "."


def arm_key(attack: str, defense: str) -> str:
    """The ``arm`` partition key of one attack under one defense, e.g. ``native.rvg``."""
    return f"{attack}{ARM_SEPARATOR}{defense}"


def parse_arm(arm: str) -> tuple[str, str]:
    """``attack.defense`` -> (attack, defense)."""
    attack, separator, defense = arm.partition(ARM_SEPARATOR)
    if not separator or not attack or not defense:
        raise ValueError(f"Arm {arm!r} is not <attack>{ARM_SEPARATOR}<defense>.")
    return attack, defense


# one attack-table cell per (benchmark, attack × defense): Dagster takes at most two dimensions, so attack and
# defense share the ``arm`` dimension; "canonical" is Table 1's fixed 10 scenarios. Keys read
# "native.vanilla|canonical" (dimensions in name order).
cell_partitions = MultiPartitionsDefinition(
    {
        "benchmark": StaticPartitionsDefinition([CANONICAL, *BENCHMARKS]),
        "arm": StaticPartitionsDefinition([arm_key(a, d) for a in ATTACKS for d in DEFENSES]),
    }
)

GROUP = "attacks"


class HarnessConfig(Config):
    detector: str = Field(
        default=PRODUCTION_CHOICE,
        description="The classifier defense's detector: production (rvu-injection-detector@production from the "
        "tracker's registry, calibrated to 1 % FPR on benign tool outputs; the asset detector_production), "
        "nanoguard (D3, the paper's PromptGuard role), heuristic (D1) or registered:<name>[@<alias>].",
    )
    max_iters: int | None = Field(
        default=None,
        description="Tool rounds per episode (bounded steps); "
        "default DefenseSettings' (4), as `rvu regress` and the golden file use.",
    )
    max_tokens: int | None = Field(
        default=None, description="Generation budget per LLM call; default DefenseSettings' (128)."
    )
    progress: bool = True
    rerun: bool = Field(
        default=False,
        description="Re-run every episode against the current code instead of reusing the rows stored by "
        "the same code version (the LLM response cache still serves identical prompts). The nightly "
        "regression sweep always re-runs.",
    )


NIGHTLY_TAG = ("rvu/sweep", "nightly")  # nightly_regression_job's tag: its episodes always re-run


def _rerun(context: AssetExecutionContext, config: HarnessConfig) -> bool:
    """Re-run every episode: asked for, or the nightly sweep (also when launched by hand from the UI)."""
    return config.rerun or context.run.tags.get(NIGHTLY_TAG[0]) == NIGHTLY_TAG[1]


class AttackCellConfig(HarnessConfig):
    limit: int | None = Field(
        default=20,
        description="Scenarios in the cell (fixed-seed sample, seed 42); "
        "null = the whole benchmark (InjecAgent dh 510 / ds 544, BIPIA test tasks × attacks).",
    )


ATTACKS_DESCRIPTION = (
    f"The attacks of the table ({', '.join(ATTACKS)}); each runs under every defense. Default: native, the "
    "benchmarks' own injections."
)


class Table1Config(HarnessConfig):
    attacks: list[str] = Field(default_factory=lambda: [NATIVE], description=ATTACKS_DESCRIPTION)


class SamplesConfig(HarnessConfig):
    per_benchmark: int = Field(
        default=2, ge=1, description="Fixed-seed sample size of each benchmark, drawn from its held-out scenarios."
    )
    attacks: list[str] = Field(default_factory=lambda: [NATIVE], description=ATTACKS_DESCRIPTION)
    benchmarks: list[str] = Field(
        default_factory=lambda: list(SWEEP_BENCHMARKS),
        description=f"The benchmarks sampled ({', '.join(SWEEP_BENCHMARKS)}): the full attack table's, whose golden "
        "cells the samples are held to.",
    )


def chosen_sweep_benchmarks(benchmarks: list[str]) -> list[str]:
    """The config's benchmarks, each one the sweep can hold to the full table (an unknown name, or the configured
    AgentDojo subset the full table has no cells of, is a ConfigError naming ``benchmarks``); duplicates dropped."""
    unknown = [b for b in benchmarks if b not in SWEEP_BENCHMARKS]
    if unknown or not benchmarks:
        raise ConfigError(
            f"Config `benchmarks` {'is empty' if not benchmarks else f'names {unknown}'}; allowed values: "
            f"{', '.join(SWEEP_BENCHMARKS)}."
        )
    return list(dict.fromkeys(benchmarks))


def chosen_attacks(attacks: list[str]) -> list[str]:
    """The config's attacks, each checked against the registry before any model loads (an unknown name is a
    ConfigError naming ``attacks``), duplicates dropped in order."""
    if not attacks:
        raise ConfigError(f"Config `attacks` is empty; allowed values: {', '.join(ATTACKS)}.")
    for name in attacks:
        get_attack(name, field="attacks")
    return list(dict.fromkeys(attacks))


def open_harness(
    config: HarnessConfig,
    llm_model: dict,
    llm: LLMResource,
    model_store: ModelStoreResource,
    mlflow_tracker: MlflowTrackerResource,
) -> Harness:
    """The harness of one attack asset; registered detectors come from the tracker resource's registry, the one
    ``detector_production`` registered into."""

    def build():  # only when a prompt misses the response cache
        return llm.build(
            Path(llm_model["path"]), n_ctx=max(AGENT_N_CTX, int(llm_model["n_ctx"])), name=llm_model["name"]
        )

    return Harness.open(
        (build, llm_model["name"]),
        profile=model_store.profile_name(),
        model_id=llm_model["sha256"],
        detector=config.detector,
        tracking_uri=mlflow_tracker.tracker(GROUP).tracking_uri,
        max_iters=config.max_iters,
        max_tokens=config.max_tokens,
        gguf_path=Path(llm_model["path"]),
    )


def _params(harness: Harness, run: CellRun, llm_model: dict) -> dict:
    hfer = {"hfer_detector": harness.hfer_version()} if run.spec.defense == "hfer" else {}
    return {
        "benchmark": run.spec.benchmark,
        "attack": run.spec.attack,
        "defense": run.spec.defense,
        "profile": run.spec.profile,
        "limit": run.spec.limit,
        "model": llm_model["name"],
        "model_sha256": llm_model["sha256"],
        "detector": harness.detector_version,
        "settings": harness.settings_fingerprint(run.spec.defense),
        "code_version": run.code_version,
        "rerun": run.rerun,
        **hfer,
    }


def log_attack_cell(
    context: AssetExecutionContext, tracker: MlflowTrackerResource, harness: Harness, run: CellRun, llm_model: dict
) -> str:
    """One MLflow run per cell: metrics with CIs and what the cell cost (inference vs cache)."""
    with tracker.run_for(
        context,
        params=_params(harness, run, llm_model),
        name=f"cell {run.spec.cell_id}",
        tags={
            "cell": run.spec.cell_id,
            "benchmark": run.spec.benchmark,
            "attack": run.spec.attack,
            "defense": run.spec.defense,
            "profile": run.spec.profile,
            "code_version": run.code_version,
        },
    ) as mlrun:
        mlrun.log_metrics({k: float(v) for k, v in {**run.metrics, **run.cost()}.items() if v == v})
        mlrun.log_artifact(run.path, "episodes")
    return mlrun.run_id


def _cost_totals(runs: list[CellRun]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for run in runs:
        for key, value in run.cost().items():
            totals[key] = totals.get(key, 0) + value
    return totals


def _png_markdown(path: Path) -> str:
    return f"![Table 1](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()})"


def _table_output(context: AssetExecutionContext, runs: list[CellRun], run_ids: list[str], title: str, stem: str):
    table = attack_table(runs)
    plot = plot_attack_table(table, state_dir() / "attacks" / f"{stem}.png", title)
    markdown = table_markdown(table)
    context.log.info(f"{title}\n{markdown}")
    cost = _cost_totals(runs)
    return table, Output(
        table,
        metadata={
            "dagster/row_count": table.height,
            "table": MetadataValue.md(markdown),
            "plot": MetadataValue.md(_png_markdown(plot)),
            "plot_path": MetadataValue.path(str(plot)),
            "mlflow_cell_run_ids": MetadataValue.json(run_ids),
            "code_version": table_code_version(table) or code_version(),
            **{k: float(v) for k, v in cost.items()},
        },
    )


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=GROUP,
    deps=[PRODUCTION_ASSET],
    partitions_def=cell_partitions,
    kinds={"llama_cpp", "agentdojo", "mlflow"},
    description="One cell of the attack table: a fixed-seed sample (config `limit`; null = all) of one benchmark "
    "(InjecAgent dh/ds, BIPIA email/table/code, AgentDojo, or the canonical 10) under one attack and one defense "
    "(partition `arm` = <attack>.<defense>, e.g. native.rvg) on the profile's LLM, judged by the benchmark's own "
    "protocol. Episodes resume from where an interrupted run "
    "stopped; a finished cell re-materializes from its rows and the LLM response cache with no inference.",
)
def attack_cell(
    context: AssetExecutionContext,
    config: AttackCellConfig,
    llm_model: dict,
    llm: LLMResource,
    model_store: ModelStoreResource,
    mlflow_tracker: MlflowTrackerResource,
):
    key = context.partition_key
    keys = (
        key.keys_by_dimension
        if isinstance(key, MultiPartitionKey)
        else cell_partitions.get_partition_key_from_str(str(key)).keys_by_dimension
    )
    attack, defense = parse_arm(keys["arm"])
    get_attack(attack, field="attack")
    harness = open_harness(config, llm_model, llm, model_store, mlflow_tracker)
    attack_context = harness.attack_context(defense)
    reason = unavailable(attack, defense, attack_context, keys["benchmark"])
    if reason is not None:  # e.g. no adaptive attack against this defense: a cell that cannot run, said so
        context.log.warning(f"{keys['benchmark']} / {attack} / {defense} not run: {reason}")
        return Output(pl.DataFrame(), metadata={"dagster/row_count": 0, "not_run": reason})
    run = harness.run_cell(
        keys["benchmark"],
        defense,
        attack=attack,
        limit=config.limit,
        progress=config.progress,
        rerun=config.rerun,
        scenarios=cell_scenarios(attack, keys["benchmark"], attack_context, config.limit),
    )
    run_id = log_attack_cell(context, mlflow_tracker, harness, run, llm_model)
    return Output(
        run.rows,
        metadata={
            "dagster/row_count": run.rows.height,
            "mlflow_run_id": run_id,
            "cell": run.spec.cell_id,
            "code_version": run.code_version,
            **{k: float(v) for k, v in {**run.metrics, **run.cost()}.items() if v == v},
        },
    )


def _golden_check(
    table: pl.DataFrame, profile: str, path: Path | None = None, attacks: list[str] | None = None
) -> AssetCheckResult:
    """The ``matches_golden`` check of a Table 1 against the golden cells of its ``attacks`` (None: every golden
    cell; ``path``: another golden file, for tests)."""
    path = Path(path) if path else golden_path(profile)
    try:
        golden = load_golden(path)
    except ConfigError as exc:
        return AssetCheckResult(
            check_name="matches_golden",
            passed=False,
            severity=AssetCheckSeverity.WARN,
            metadata={"reason": str(exc), "golden": str(path)},
        )
    tolerance = load_tolerance()
    drifts = compare_to_golden(table, golden_subset(golden, None, attacks), tolerance)
    return AssetCheckResult(
        check_name="matches_golden",
        passed=not drifts,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "golden": str(path),
            "drifts": MetadataValue.md(drift_markdown(drifts)),
            "drift_rows": MetadataValue.json(drifts_as_dicts(drifts)),
            "tolerance_asr": tolerance.asr,
            "tolerance_utility": tolerance.utility,
            "tolerance_errors": tolerance.errors,
            "code_version": table_code_version(table) or code_version(),
            "golden_code_version": str(golden.get("code_version", "unrecorded")),
        },
    )


@asset(
    code_version=CODE_VERSION,
    group_name=GROUP,
    deps=[PRODUCTION_ASSET],
    kinds={"llama_cpp", "agentdojo", "mlflow"},
    description="Seed 000 Table 1 (E1): the 10 canonical scenarios (configs/benchmarks.yaml) under the configured "
    "attacks (config `attacks`, default native) and all eight defenses on the profile's LLM — ASR, security, "
    "utility with 95% CIs, latency, certificates emitted and verified — as a markdown table, parquet and a plot; "
    "one MLflow run per cell. Checked against the committed "
    "golden results (configs/golden/) by the nightly regression sweep.",
    check_specs=[
        AssetCheckSpec(
            "matches_golden",
            asset="attack_table_1",
            description="Every cell against its benchmark/attack/defense cell of "
            "configs/golden/table1_<profile>.json: n (scored episodes) exact, "
            "errored episodes at most golden's + tolerance, ASR and utility within tolerance "
            "(configs/regression.yaml); the diff is in the metadata.",
        )
    ],
)
def attack_table_1(
    context: AssetExecutionContext,
    config: Table1Config,
    llm_model: dict,
    llm: LLMResource,
    model_store: ModelStoreResource,
    mlflow_tracker: MlflowTrackerResource,
):
    attacks = chosen_attacks(config.attacks)
    harness = open_harness(config, llm_model, llm, model_store, mlflow_tracker)
    if _rerun(context, config):  # every episode, current code
        runs = regression_sweep(harness, DEFENSES, attacks=attacks, progress=config.progress)
    else:  # same-code rows are reused
        runs = [
            run
            for attack in attacks
            for run in harness.run_table(CANONICAL, DEFENSES, progress=config.progress, attack=attack)
        ]
    run_ids = [log_attack_cell(context, mlflow_tracker, harness, run, llm_model) for run in runs]
    table, output = _table_output(
        context, runs, run_ids, f"Table 1 — canonical scenarios ({harness.profile})", "table1"
    )
    yield output
    yield _golden_check(table, harness.profile, attacks=attacks)


@asset(
    code_version=CODE_VERSION,
    tags=NIGHTLY_ONLY,
    group_name=GROUP,
    deps=[PRODUCTION_ASSET],
    kinds={"llama_cpp", "agentdojo", "mlflow"},
    check_specs=[
        AssetCheckSpec(
            RATES_CHECK,
            asset="attack_benchmark_samples",
            description="Each cell's ASR against the same cell of configs/golden/table1_full_<profile>.json "
            "(Fisher's exact test, Holm over the cells, alpha 0.05); a sample of a few scenarios detects only "
            "large moves.",
        )
    ],
    description="A fixed-seed sample (config `per_benchmark`, seed 42) of the held-out scenarios of every benchmark "
    "of the full attack table — InjecAgent dh/ds, BIPIA email/table/code, the four AgentDojo suites — under the "
    "configured attacks (config `attacks`, default native) and all eight defenses; one MLflow run per cell. Runs in "
    "the nightly sweep (minutes of LLM inference), not in the default job. Full benchmarks are `attack_cell` "
    "partitions.",
)
def attack_benchmark_samples(
    context: AssetExecutionContext,
    config: SamplesConfig,
    llm_model: dict,
    llm: LLMResource,
    model_store: ModelStoreResource,
    mlflow_tracker: MlflowTrackerResource,
):
    attacks = chosen_attacks(config.attacks)
    benchmarks = chosen_sweep_benchmarks(config.benchmarks)
    harness = open_harness(config, llm_model, llm, model_store, mlflow_tracker)
    runs = [
        run
        for benchmark in benchmarks
        for scenarios in [heldout_sample(benchmark, config.per_benchmark)]  # the golden cells' population
        for attack in attacks
        for run in harness.run_table(
            benchmark,
            DEFENSES,
            limit=config.per_benchmark,
            progress=config.progress,
            rerun=_rerun(context, config),
            scenarios=scenarios,
            attack=attack,
        )
    ]
    run_ids = [log_attack_cell(context, mlflow_tracker, harness, run, llm_model) for run in runs]
    table, output = _table_output(context, runs, run_ids, f"Benchmark samples ({harness.profile})", "samples")
    yield output
    yield _full_golden_rates_check(table, harness.profile)


def _full_golden_rates_check(table: pl.DataFrame, profile: str) -> AssetCheckResult:
    """The sample's ASR per cell against the full table's golden cells (other scenarios, other n: Fisher's exact
    test, Holm over the cells)."""
    path = golden_full_path(profile)
    try:
        golden = load_golden(path)
    except ConfigError as exc:
        return AssetCheckResult(
            check_name=RATES_CHECK, passed=False, severity=AssetCheckSeverity.WARN, metadata={"reason": str(exc)}
        )
    comparisons = asr_against_golden(table, golden)
    return AssetCheckResult(
        check_name=RATES_CHECK,
        passed=not any(c.differs for c in comparisons),
        severity=AssetCheckSeverity.WARN,
        metadata={
            "golden": str(path),
            "cells_compared": len(comparisons),
            "comparisons": MetadataValue.md(rate_comparison_markdown(comparisons)),
        },
    )


def attack_assets() -> list[AssetsDefinition]:
    return [attack_cell, attack_table_1, attack_benchmark_samples]


attack_cells_job = define_asset_job(
    "attack_cells_job",
    selection=AssetSelection.assets("attack_cell"),
    executor_def=JOB_EXECUTOR,
    description="Attack-table cells (partitions benchmark × arm, an arm being <attack>.<defense>, e.g. "
    "`native.rvg|canonical`): launch or backfill any cell from the UI; config `limit` sets the sample size "
    "(null = the whole benchmark).",
)


nightly_regression_job = define_asset_job(
    "nightly_regression_job",
    selection=AssetSelection.assets("attack_table_1", "attack_benchmark_samples"),
    executor_def=JOB_EXECUTOR,
    tags={"rvu/sweep": "nightly"},
    description="Re-run the canonical attack cells (Table 1) and check them against configs/golden/ "
    "(tolerances in configs/regression.yaml), and a fixed-seed sample of every benchmark under every defense. "
    "MLflow runs carry the tag rvu_sweep=nightly.",
)


def attack_jobs() -> list:
    return [attack_cells_job, nightly_regression_job]
