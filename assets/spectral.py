"""Seed 004's spectral kill switch as assets on the agent's own weights (thin: the library does the work in
``rvu_pipelines.spectral``):

- ``spectral_kill_switch_sample``: the default job's sampled study (two sets, a few pairs each);
- ``spectral_kill_switch_cell``: partitioned by data source × model profile, one cell's switch calibrated
  on 20 and on all calibration examples, held-out AUROC / TPR / FPR, per-layer HFER AUROC, the statistic's
  time, plots in MLflow; ``spectral_cells_job``;
- ``spectral_study``, ``spectral_controls``, ``spectral_hfer_cost``: the full study (``spectral_study_job``,
  ``make spectral``): the switch against its baselines, under its controls, and the inline defense's cost.
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
    Failure,
    MetadataValue,
    MultiPartitionsDefinition,
    Output,
    StaticPartitionsDefinition,
    asset,
    define_asset_job,
)
from pydantic import Field

from assets.executors import JOB_EXECUTOR
from assets.full_study import launched_command, run_full_study
from assets.profiles import FULL_STUDY
from resources import MlflowTrackerResource, ModelStoreResource
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.errors import ModelUnavailableError
from rvu_pipelines.paths import state_dir
from rvu_pipelines.result_memo import ResultMemo, frame_digest, reuse_message
from rvu_pipelines.spectral import SpectralInputError, load_spectral_model
from rvu_pipelines.spectral.cell import (
    AUROC_GOALS,
    CALIBRATION_GAP,
    DEFAULT_LIMIT,
    DEFAULT_THREADS,
    SMALL_CALIBRATION,
    SMALL_DRAWS,
    SOURCES,
    build_examples,
    cell_checks,
    load_cell_model,
    profile_names,
    run_cell,
)
from rvu_pipelines.spectral.config import DEFAULT_GRAPH_CONFIG, GRAPH_CONFIGS, graph_config
from rvu_pipelines.spectral.controls_run import CONTROL_GRAPHS, CONTROL_SETS, ControlsOptions, run_controls
from rvu_pipelines.spectral.cost_run import COST_POLICIES, CostOptions, run_cost
from rvu_pipelines.spectral.data import SOURCE_FRAMES, context_verification, injecagent_contamination
from rvu_pipelines.spectral.errors import CalibrationError
from rvu_pipelines.spectral.study import SampledResult, sampled_study
from rvu_pipelines.spectral.study_run import STUDY_SETS, StudyOptions, run_study
from rvu_pipelines.tracking import numeric_metrics

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

# one spectral kill-switch cell per (data source, model profile of configs/models.yaml); keys read "tiny|bipia"
spectral_partitions = MultiPartitionsDefinition(
    {"source": StaticPartitionsDefinition(list(SOURCES)), "profile": StaticPartitionsDefinition(profile_names())}
)

ASSET = "spectral_kill_switch_sample"
PER_SET = 24  # examples per evaluation set: 6 calibration + 6 held-out pairs (the asset's time budget)
AUROC_GOAL = 0.95  # goal: context verification at the best early layer
LATENCY_GOAL_MS = 1.0  # seed 004: the statistic alone, per layer


GRAPH_DESCRIPTION = (
    "graph configuration (sinks, signal, Laplacian, eigenpairs): one of " + ", ".join(GRAPH_CONFIGS) + "; the "
    "full study's default"
)


def _checked_graph(graph: str) -> str:
    """The library names the allowed values; the asset says which config field was wrong."""
    try:
        graph_config(graph)
    except SpectralInputError as exc:
        raise Failure(description=f"config graph: {exc}") from exc
    return graph


class SpectralSampleConfig(Config):
    per_set: int = Field(default=PER_SET, ge=8, description="examples per evaluation set (whole pairs)")
    graph: str = Field(default=DEFAULT_GRAPH_CONFIG, description=GRAPH_DESCRIPTION)


@asset(
    code_version=CODE_VERSION,
    group_name="spectral",
    kinds={"mlflow"},
    description="Seed 004 (arXiv 2511.05804) sampled: the packaged LLM's attention token graphs (head-mean, "
    "(A+Aᵀ)/2; config graph, default the sink-free configuration: attention sinks removed, centred signal, "
    "normalised Laplacian; pairs kept whole under the full study's token limit), "
    "HFER / spectral entropy / Fiedler / smoothness of the layer's hidden "
    f"states per layer, on {PER_SET} real examples per set (config per_set; TOFU context verification; InjecAgent tool "
    "responses with vs without the injected instruction): the switch (layer, statistic, Bayes threshold of a "
    "two-component Gaussian mixture) calibrated on the sample's calibration part, AUROC / TPR / FPR with "
    "bootstrap CIs on its held-out part, and the statistic's time per layer.",
    check_specs=[
        AssetCheckSpec("heldout_auroc_reported", asset=ASSET, blocking=True),
        AssetCheckSpec("context_verification_auroc_goal", asset=ASSET),
        AssetCheckSpec("statistic_latency_goal", asset=ASSET),
    ],
)
def spectral_kill_switch_sample(
    context: AssetExecutionContext,
    config: SpectralSampleConfig,
    mlflow_tracker: MlflowTrackerResource,
    llm_model: dict,
    tofu: pl.DataFrame,
    injecagent: pl.DataFrame,
):
    graph = _checked_graph(config.graph)
    params = {
        "model": llm_model["name"],
        "model_sha256": llm_model["sha256"],
        "per_set": config.per_set,
        "graph": graph,
    }
    frames = {"tofu": frame_digest(tofu), "injecagent": frame_digest(injecagent)}
    memo = ResultMemo.default().entry(ASSET, {"params": params, "frames": frames}, code=__name__)
    stored = memo.load()
    reused = stored is not None
    if stored is not None:  # nothing it depends on changed since that MLflow run
        context.log.info(reuse_message(stored))
    else:
        model = load_spectral_model(Path(llm_model["path"]), sha256=llm_model["sha256"], n_ctx=int(llm_model["n_ctx"]))
        sets = {
            "context_verification": context_verification(tofu),
            "injecagent": injecagent_contamination(injecagent, tofu),
        }
        with mlflow_tracker.run_for(context, params=params) as run:
            computed = sampled_study(model, sets, per_set=config.per_set, graph=graph)
            metrics: dict[str, float] = {}
            for name, result in computed.items():
                for what, estimate in result.heldout.items():
                    metrics[f"{name}_{what}"] = float(estimate["value"])
                    metrics[f"{name}_{what}_low"] = float(estimate["low"])
                    metrics[f"{name}_{what}_high"] = float(estimate["high"])
                metrics[f"{name}_statistic_ms_per_layer"] = result.statistic_ms_per_layer
                for row in result.hfer_by_layer:
                    run.log_metrics({f"{name}_hfer_auroc": float(row["auroc"])}, step=int(row["layer"]))
            run.log_metrics(metrics)
        stored = memo.save({"results": {n: r.as_dict() for n, r in computed.items()}, "mlflow_run_id": run.run_id})
    results = {name: SampledResult(**fields) for name, fields in stored["results"].items()}
    table = ["| set | n cal / held-out | layer | statistic | held-out AUROC [95% CI] | TPR | FPR | ms/layer |"]
    table.append("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        a, s = r.heldout["auroc"], r.switch
        table.append(
            f"| {name} | {r.n_calibration} / {r.n_heldout} | {s['layer']} | {s['statistic']} | "
            f"{a['value']:.3f} [{a['low']:.3f}, {a['high']:.3f}] | {r.heldout['tpr']['value']:.2f} | "
            f"{r.heldout['fpr']['value']:.2f} | {r.statistic_ms_per_layer:.2f} |"
        )
    report = {name: r.as_dict() for name, r in results.items()}
    yield Output(
        report,
        metadata={
            "results": MetadataValue.md("\n".join(table)),
            "state_folder": str(state_dir()),
            "mlflow_run_id": stored["mlflow_run_id"],
            "reused_unchanged_result": reused,
        },
    )
    yield AssetCheckResult(
        check_name="heldout_auroc_reported",
        passed=all(0.0 <= r.heldout["auroc"]["value"] <= 1.0 and r.n_heldout > 0 for r in results.values()),
    )
    verification = results["context_verification"].heldout["auroc"]
    yield AssetCheckResult(
        check_name="context_verification_auroc_goal",
        passed=bool(verification["value"] >= AUROC_GOAL),
        severity=AssetCheckSeverity.WARN,
        metadata={"auroc": float(verification["value"]), "goal": AUROC_GOAL, "n": int(verification["n"])},
    )
    slowest = max(r.statistic_ms_per_layer for r in results.values())
    yield AssetCheckResult(
        check_name="statistic_latency_goal",
        passed=bool(slowest < LATENCY_GOAL_MS),
        severity=AssetCheckSeverity.WARN,
        metadata={"ms_per_layer": slowest, "goal_ms": LATENCY_GOAL_MS},
    )


CELL = "spectral_kill_switch_cell"
CELL_CHECKS = {  # name -> (blocking, description)
    "heldout_auroc_reported": (True, "The held-out AUROC, TPR and FPR exist and are finite."),
    "auroc_goal": (
        False,
        "Goal: held-out AUROC ≥ 0.95 for context verification, ≥ 0.90 for the contamination sources.",
    ),
    "calibration_20_vs_all": (
        False,
        f"A switch calibrated on {SMALL_CALIBRATION} examples is within {CALIBRATION_GAP} held-out AUROC of the "
        "switch calibrated on the whole calibration part (mean over draws).",
    ),
    "overhead_goal": (False, "Seed 004: the statistic alone takes < 1 ms per layer at the cell's median length."),
}


class SpectralCellConfig(Config):
    limit: int = Field(
        default=DEFAULT_LIMIT, ge=8, description="examples per cell (whole pairs; 40% held out, the rest calibrate)"
    )
    small: int = Field(default=SMALL_CALIBRATION, ge=4, description="the small calibration's size")
    draws: int = Field(default=SMALL_DRAWS, ge=1, description="stratified draws of the small calibration")
    threads: int = Field(default=DEFAULT_THREADS, ge=1, description="torch / BLAS threads")
    graph: str = Field(default=DEFAULT_GRAPH_CONFIG, description=GRAPH_DESCRIPTION)


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name="spectral",
    kinds={"mlflow"},
    partitions_def=spectral_partitions,
    description="One kill-switch cell per data source (TOFU context verification; BIPIA, InjecAgent and deepset "
    "contamination) × model profile (configs/models.yaml): the profile's LLM, "
    f"{DEFAULT_LIMIT} examples by default (config limit; whole pairs), the switch calibrated on "
    f"{SMALL_CALIBRATION} and on all calibration examples and evaluated on the held-out ones (AUROC with bootstrap "
    "CI, TPR, FPR), per-layer HFER AUROC, the statistic's ms per layer; an MLflow run in rvu-spectral with the "
    "histograms and ROC curves. A profile whose weights are not here (paper, offline) fails with the reason.",
    check_specs=[
        AssetCheckSpec(name, asset=CELL, blocking=blocking, description=description)
        for name, (blocking, description) in CELL_CHECKS.items()
    ],
)
def spectral_kill_switch_cell(
    context: AssetExecutionContext,
    config: SpectralCellConfig,
    mlflow_tracker: MlflowTrackerResource,
    model_store: ModelStoreResource,
    tofu: pl.DataFrame,
    bipia: pl.DataFrame,
    injecagent: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
):
    keys = context.partition_key.keys_by_dimension  # type: ignore[attr-defined]
    source, profile = keys["source"], keys["profile"]
    graph = _checked_graph(config.graph)
    try:
        model, record = load_cell_model(profile, store=model_store.store())
    except ModelUnavailableError as exc:
        raise Failure(description=str(exc), metadata={"profile": profile, "source": source}) from exc
    frames = {
        "tofu": tofu,
        "bipia": bipia,
        "injecagent": injecagent,
        "deepset_prompt_injections": deepset_prompt_injections,
    }
    examples = build_examples(source, frames)
    params = {
        "source": source,
        "profile": profile,
        "model": record["name"],
        "model_sha256": record["sha256"],
        "limit": config.limit,
        "small": config.small,
        "draws": config.draws,
        "threads": config.threads,
        "graph": graph,
        "auroc_goal": AUROC_GOALS[source],
    }

    def progress(done: int, total: int) -> None:
        if done % 20 == 0:
            context.log.info(f"{source} × {profile}: example {done + 1} of {total}")

    with mlflow_tracker.run_for(context, params=params) as run:
        result = run_cell(
            model,
            examples,
            state_dir() / "spectral" / "cells" / f"{source}-{profile}",
            source=source,
            profile=profile,
            limit=config.limit,
            small=config.small,
            draws=config.draws,
            threads=config.threads,
            graph=graph,
            progress=progress,
        )
        run.log_metrics(result.metrics())
        for row in result.hfer_by_layer:
            run.log_metrics({"hfer_auroc_by_layer": float(row["auroc"])}, step=int(row["layer"]))
        for path in result.files.values():
            run.log_artifact(path)
    heldout = result.heldout["auroc"]
    yield Output(
        result.summary(),
        metadata={
            "switches": MetadataValue.md(result.table()),
            "hfer_by_layer": MetadataValue.md(result.layer_table()),
            "heldout_auroc": float(heldout["value"]),
            "heldout_auroc_ci": f"[{heldout['low']:.3f}, {heldout['high']:.3f}]",
            "n_calibration": result.n_calibration,
            "n_heldout": result.n_heldout,
            "dropped_long_examples": result.dropped_long,
            "seconds_per_example": round(result.seconds_per_example, 3),
            "statistic_ms_per_layer": round(result.statistic_ms_per_layer, 3),
            "roc": MetadataValue.path(str(result.files["roc_png"])),
            "model": str(record["name"]),
            "mlflow_run_id": run.run_id,
        },
    )
    for name, (passed, metadata) in cell_checks(result).items():
        yield AssetCheckResult(
            check_name=name,
            passed=passed,
            severity=AssetCheckSeverity.ERROR if CELL_CHECKS[name][0] else AssetCheckSeverity.WARN,
            metadata=metadata,
        )


# ---- the full study (`make spectral`): the study, its controls and the inline defense's cost, as one job

STUDY_GROUP = "spectral_study"
STUDY_REFUSALS = (SpectralInputError, CalibrationError, ValueError)  # the library's refusals of bad input
SOURCE_FRAME_INPUTS = "tofu, bipia, injecagent and deepset_prompt_injections"


def _study_folder(out: str | None, default: str) -> Path:
    """Where a full-study asset writes its tables and plots (``rvu report`` reads them there)."""
    return Path(out) if out else state_dir() / default


def _source_frames(*frames: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The data set assets a full study reads, in ``SOURCE_FRAMES`` order, by their catalog names."""
    return dict(zip(SOURCE_FRAMES, frames, strict=True))


class SpectralStudyConfig(Config):
    sets: list[str] = Field(default=list(STUDY_SETS), description="evaluation sets (data.spectral_sets)")
    limit: int = Field(default=400, ge=8, description="examples per set (whole pairs)")
    limits: dict[str, int] = Field(default_factory=dict, description="examples for a set by name, e.g. {bipia: 300}")
    scopes: list[str] = Field(default=["text", "document"], description="text, document or both")
    max_tokens: int = Field(default=384, ge=16, description="examples longer than this are skipped")
    graph: str = Field(default="sink_free", description=GRAPH_DESCRIPTION)
    draws: int = Field(default=20, ge=1, description="calibration draws per size")
    comparison: bool = Field(default=True, description="score the baselines and write the comparison table")
    threads: int = Field(default=DEFAULT_THREADS, ge=1, description="torch / BLAS threads")
    out: str | None = Field(default=None, description="output folder; default <RVU_HOME>/spectral")


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    description="Seed 004's study in full on the packaged LLM: features per set and scope, per-layer held-out "
    "AUROC, 20/50/200 calibration, the token-count confound, histograms, and (config comparison) the baselines "
    "(Attention Tracker, perplexity, D1-D5) on the same held-out splits with the leave-one-dataset-out table; "
    "features cached by a digest of the examples. Writes comparison.md, calibration.csv and report.json.",
)
def spectral_study(
    context: AssetExecutionContext,
    config: SpectralStudyConfig,
    mlflow_tracker: MlflowTrackerResource,
    tofu: pl.DataFrame,
    bipia: pl.DataFrame,
    injecagent: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
) -> Output[dict]:
    _checked_graph(config.graph)
    out = _study_folder(config.out, "spectral")
    options = StudyOptions(
        sets=tuple(config.sets),
        limit=config.limit,
        limits=dict(config.limits),
        scopes=tuple(config.scopes),
        max_tokens=config.max_tokens,
        graph=config.graph,
        draws=config.draws,
        comparison=config.comparison,
    )
    frames = _source_frames(tofu, bipia, injecagent, deepset_prompt_injections)
    report, metadata = run_full_study(
        context,
        mlflow_tracker,
        config,
        lambda: run_study(options, out, frames=frames, say=context.log.info),
        out=out,
        page="comparison.md",
        artifacts=("comparison.md", "comparison.csv", "calibration.csv", "report.json"),
        metrics=numeric_metrics,
        threads=config.threads,
        refusals=STUDY_REFUSALS,
    )
    return Output(report, metadata=metadata)


class SpectralControlsConfig(Config):
    sets: list[str] = Field(default=list(CONTROL_SETS), description="sets (agentdojo joins data.spectral_sets)")
    graphs: list[str] = Field(default=list(CONTROL_GRAPHS), description="graph configurations, one forward pass")
    groups: int = Field(default=40, ge=8, description="groups (pairs / triples) per set, 40 % held out")
    max_tokens: int = Field(default=384, ge=16, description="whole groups only, each member at most this long")
    seed: int = Field(default=0, description="sampling and resampling seed")
    detectors: bool = Field(default=True, description="D1-D5 beside the switch (D2 / D4 train on deepset: minutes)")
    threads: int = Field(default=DEFAULT_THREADS, ge=1, description="torch / BLAS threads")
    out: str | None = Field(default=None, description="output folder; default <RVU_HOME>/spectral/controls")


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    description="The switch under its controls on the same held-out splits: sink-free graphs, pairs as pairs with "
    "length-matched padded clean texts, the length confound, a linear probe over every feature "
    "(leave-one-set-out), Attention Tracker and D1-D5 beside it, Holm-corrected paired tests. Writes "
    "controls.md / controls.json, stamped with the job, commit, date and machine.",
)
def spectral_controls(
    context: AssetExecutionContext,
    config: SpectralControlsConfig,
    mlflow_tracker: MlflowTrackerResource,
    tofu: pl.DataFrame,
    bipia: pl.DataFrame,
    injecagent: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
) -> Output[dict]:
    for graph in config.graphs:
        _checked_graph(graph)
    out = _study_folder(config.out, "spectral/controls")
    options = ControlsOptions(
        sets=tuple(config.sets),
        graphs=tuple(config.graphs),
        groups=config.groups,
        max_tokens=config.max_tokens,
        seed=config.seed,
        detectors=config.detectors,
    )
    frames = _source_frames(tofu, bipia, injecagent, deepset_prompt_injections)
    report, metadata = run_full_study(
        context,
        mlflow_tracker,
        config,
        lambda: run_controls(
            options, out, command=launched_command(context, config), frames=frames, say=context.log.info
        ),
        out=out,
        page="controls.md",
        artifacts=("controls.md", "controls.json"),
        metrics=lambda report: numeric_metrics({"tracker": report["tracker"]}),
        threads=config.threads,
        refusals=STUDY_REFUSALS,
    )
    kept = {"switch": report["switch"], "probe_lodo": report.get("probe_lodo", []), "stamp": report["stamp"]}
    return Output(kept, metadata=metadata)


class HferCostConfig(Config):
    suites: list[str] | None = Field(default=None, description="AgentDojo suites (default: all four)")
    per_source: int = Field(default=120, ge=2, description="examples per source (whole pairs)")
    profile: str | None = Field(default=None, description="model profile (default: the configured one)")
    policies: list[str] = Field(default=list(COST_POLICIES), description="threshold policies: benign_fpr, bayes")
    seed: int = Field(default=0, description="sampling seed")
    threads: int = Field(default=DEFAULT_THREADS, ge=1, description="torch / BLAS threads")
    out: str | None = Field(default=None, description="output folder; default <RVU_HOME>/spectral")


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=STUDY_GROUP,
    kinds={"mlflow"},
    description="The inline hfer defense's real cost: the agent's own switch per threshold policy, FPR on clean "
    "and TPR on injected AgentDojo tool outputs of held-out user tasks and on held-out BIPIA / InjecAgent pairs, "
    "latency per tool output. Writes hfer_cost.md / hfer_cost.json, stamped.",
)
def spectral_hfer_cost(
    context: AssetExecutionContext,
    config: HferCostConfig,
    mlflow_tracker: MlflowTrackerResource,
    tofu: pl.DataFrame,
    bipia: pl.DataFrame,
    injecagent: pl.DataFrame,
    deepset_prompt_injections: pl.DataFrame,
) -> Output[dict]:
    out = _study_folder(config.out, "spectral")
    options = CostOptions(
        suites=tuple(config.suites) if config.suites is not None else None,
        per_source=config.per_source,
        profile=config.profile,
        policies=tuple(config.policies),
        seed=config.seed,
    )
    frames = _source_frames(tofu, bipia, injecagent, deepset_prompt_injections)
    document, metadata = run_full_study(
        context,
        mlflow_tracker,
        config,
        lambda: run_cost(options, out, command=launched_command(context, config), frames=frames, say=context.log.info),
        out=out,
        page="hfer_cost.md",
        artifacts=("hfer_cost.md", "hfer_cost.json"),
        metrics=lambda document: numeric_metrics({p: document[p] for p in options.policies}),
        threads=config.threads,
        refusals=STUDY_REFUSALS,
    )
    return Output(document, metadata=metadata)


def spectral_assets() -> list:
    return [
        spectral_kill_switch_sample,
        spectral_kill_switch_cell,
        spectral_study,
        spectral_controls,
        spectral_hfer_cost,
    ]


spectral_cells_job = define_asset_job(
    "spectral_cells_job",
    selection=AssetSelection.assets("spectral_kill_switch_cell"),
    executor_def=JOB_EXECUTOR,
    description="Seed 004's kill switch, one data source × model profile per partition (e.g. `tiny|bipia`): "
    "calibrated on 20 and on all calibration examples, held-out AUROC / TPR / FPR, plots in MLflow; "
    "config `limit` sets the examples per cell.",
)


spectral_study_job = define_asset_job(
    "spectral_study_job",
    selection=AssetSelection.groups("spectral_study").upstream(),
    executor_def=JOB_EXECUTOR,
    description="Seed 004 in full (`make spectral`, configs/runs/spectral.yaml): the switch against its baselines "
    "with the leave-one-dataset-out table, the switch under its controls, and the inline hfer defense's cost; "
    "hours of CPU, features cached by a digest of the examples.",
)


def spectral_jobs() -> list:
    return [spectral_cells_job, spectral_study_job]
