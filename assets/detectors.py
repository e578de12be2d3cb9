"""Detector assets (seed 002 §5-6): the three corpora, D2 and D4 trained and registered in MLflow per
corpus, and one evaluation table (D1-D5 with 95% CIs, latency, ROC image) per corpus.

Thin wrappers over rvu_pipelines.detectors; every MLflow run is one asset materialization.
"""

import base64
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    AssetsDefinition,
    AssetSelection,
    Config,
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
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.detectors import (
    CORPUS_NAMES,
    Corpus,
    TfidfDetector,
    build_corpus,
    evaluate_corpus,
    load_pretrained_detector,
    load_registered_detector,
    point_metrics,
    registered_name,
    settings_for,
)
from rvu_pipelines.detectors.corpora import DESCRIPTIONS, SOURCE_DATASETS, cross_split_pairs, stratified_subsample
from rvu_pipelines.detectors.d4_registration import register_reference, train_and_register_d4
from rvu_pipelines.detectors.evaluation import LODO_DATASETS, ORDER, LodoSettings, leave_one_dataset_out
from rvu_pipelines.detectors.finetune import ENCODER_ROLE, EncoderRef
from rvu_pipelines.detectors.registry import (
    CURRENT_ALIAS,
    ONNX_ALIAS,
    registered_ref,
    reinstate_versions,
)
from rvu_pipelines.detectors.validity_run import BURIED_PAIRS
from rvu_pipelines.paths import state_dir
from rvu_pipelines.reporting import markdown_table
from rvu_pipelines.result_memo import MemoEntry, ResultMemo, frame_digest, reuse_message
from rvu_pipelines.tracking import numeric_metrics

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

GROUP = "detectors"
VALIDITY_GROUP = "detector_validity"  # its own job: `make detectors` does not run it
PAPER_GOAL_F1 = {"deepset": 0.9474}  # goal: D4 or D5 F1 on deepset >= the paper's 94.74%
SCORE_CHECK_TEXTS = 32


def _corpus(name: str, frame: pl.DataFrame) -> Corpus:
    return Corpus(name, frame, DESCRIPTIONS[name])


def _split_problems(name: str, frame: pl.DataFrame) -> list[str]:
    """What would make the evaluation invalid: a text or a near-duplicate pair (Jaccard >= 0.5 on word
    5-grams) in both splits, a split missing a label, wrong counts."""
    corpus = _corpus(name, frame)
    problems = []
    overlap = set(corpus.texts("train")) & set(corpus.texts("test"))
    if overlap:
        problems.append(f"{len(overlap)} texts are in both train and test")
    twins = cross_split_pairs(frame)
    if twins:
        problems.append(f"{len(twins)} near-duplicate pairs across the split, e.g. {twins[:3]}")
    counts = corpus.counts()
    for split in ("train", "test"):
        for label in (0, 1):
            if counts.get(f"{split}/{label}", 0) == 0:
                problems.append(f"{split} has no rows with label {label}")
    if name == "deepset":
        sizes = {s: corpus.part(s).height for s in ("train", "test")}
        if sizes != {"train": 541, "test": 116}:
            problems.append(f"deepset split sizes {sizes} differ from 541/116 (upstream 546/116 less 5 twins)")
    else:
        fraction = corpus.part("test").height / frame.height
        if abs(fraction - 0.2) > 0.01:
            problems.append(f"test fraction {fraction:.3f} is not 0.2")
    return problems


def _corpus_asset(name: str) -> AssetsDefinition:
    key = f"detector_corpus_{name}"
    sources = SOURCE_DATASETS[name]

    @asset(
        code_version=CODE_VERSION,
        name=key,
        group_name=GROUP,
        ins={dataset: AssetIn(key=dataset) for dataset in sources},
        description=f"Detector corpus '{name}' (seed 002 §5.1): {DESCRIPTIONS[name]} Columns id, text, label "
        "(1 = injection), split, source; whitespace-normalised.",
        kinds={"polars", "parquet"},
        check_specs=[
            AssetCheckSpec(
                "split_is_clean",
                asset=key,
                blocking=True,
                description="No text and no near-duplicate pair (Jaccard >= 0.5, word 5-grams) in both splits; "
                "both labels in both splits; split sizes as specified.",
            )
        ],
    )
    def _corpus_fn(context: AssetExecutionContext, **datasets: pl.DataFrame):
        corpus = build_corpus(name, datasets)
        problems = _split_problems(name, corpus.frame)
        context.log.info(f"corpus {name}: {corpus.counts()}")
        yield Output(
            corpus.frame,
            metadata={
                "dagster/row_count": corpus.frame.height,
                "counts": MetadataValue.json(corpus.counts()),
                "description": corpus.description,
                "preview": MetadataValue.md(markdown_table(corpus.frame.head(5))),
            },
        )
        yield AssetCheckResult(
            check_name="split_is_clean", passed=not problems, metadata={"problems": MetadataValue.json(problems)}
        )

    return _corpus_fn


def _same_scores_check(
    check: str, name: str, uri: str, version: str, texts: list[str], expected: np.ndarray, tolerance: float
) -> AssetCheckResult:
    loaded = load_registered_detector(name, uri, version)
    diff = float(np.max(np.abs(loaded.score(texts) - expected))) if texts else 0.0
    return AssetCheckResult(
        check_name=check,
        passed=diff <= tolerance,
        metadata={
            "registered_name": name,
            "version": version,
            "texts": len(texts),
            "max_abs_score_diff": diff,
            "tolerance": tolerance,
        },
    )


def _reused_registration(context: AssetExecutionContext, memo: MemoEntry, name: str, uri: str) -> dict | None:
    """A detector trained before from exactly these inputs, code and settings, whose registered versions are
    still in the registry: its aliases point at them again and its stored result comes back (else None). The
    asset's checks then load those versions and compare their scores, as after training."""
    stored = memo.load()
    if stored is None or not reinstate_versions(name, uri, dict(stored["aliases"])):
        return None
    context.log.info(f"{reuse_message(stored)}: {name} versions {stored['aliases']}")
    return {**stored, "reused": True}


def _registration_parts(params: dict, corpus_frame: pl.DataFrame, uri: str, name: str) -> dict:
    """What a trained-and-registered detector depends on besides the code (the memo adds that)."""
    return {"params": params, "corpus": frame_digest(corpus_frame), "registry": uri, "name": name}


def _registration_metadata(name: str, version: Any, stored: dict, metrics: dict) -> dict:
    """The Output metadata of a trained-or-reused detector (``stored``: the memo's result)."""
    return {
        "registered_name": name,
        "version": version,
        "mlflow_run_id": stored["mlflow_run_id"],
        "reused_unchanged_result": bool(stored.get("reused")),
        **{k: float(v) for k, v in metrics.items()},
    }


REGISTRY_CHECK = "registered_model_reproduces_scores"
ONNX_CHECK = "onnx_runtime_agrees"
ONNX_F1_TOLERANCE_POINTS = 0.5  # goal: the fast runtime keeps F1 within half a point of the reference


class D2TrainConfig(Config):
    """``max_train_samples`` subsamples (stratified) for quick runs; default the whole training split."""

    max_train_samples: int | None = Field(default=None, description="Stratified subsample of the training split.")


def _d2_asset(corpus_name: str) -> AssetsDefinition:
    key = f"detector_d2_{corpus_name}"

    @asset(
        code_version=CODE_VERSION,
        name=key,
        group_name=GROUP,
        ins={"corpus_frame": AssetIn(key=f"detector_corpus_{corpus_name}")},
        description=f"D2 (char 1-4-gram TF-IDF + balanced logistic regression, seed 002 settings) trained on the "
        f"'{corpus_name}' training split, logged with mlflow.sklearn (skops) and registered as "
        f"{registered_name('d2', corpus_name)} (alias 'current').",
        kinds={"scikitlearn", "mlflow"},
        check_specs=[
            AssetCheckSpec(
                REGISTRY_CHECK,
                asset=key,
                blocking=True,
                description="The registered model loads by name and gives the trained model's scores.",
            )
        ],
    )
    def _d2(
        context: AssetExecutionContext,
        config: D2TrainConfig,
        corpus_frame: pl.DataFrame,
        mlflow_tracker: MlflowTrackerResource,
    ):
        corpus = _corpus(corpus_name, corpus_frame)
        texts, y = corpus.texts("test"), corpus.labels("test")
        train = stratified_subsample(corpus.part("train"), config.max_train_samples)
        uri = mlflow_tracker.tracker().tracking_uri
        params = {
            "corpus": corpus_name,
            "detector": "D2",
            "n_train": train.height,
            "n_test": len(y),
            **TfidfDetector.params(),
        }
        name = registered_name("d2", corpus_name)
        memo = ResultMemo.default().entry(key, _registration_parts(params, corpus_frame, uri, name), code=__name__)
        stored = _reused_registration(context, memo, name, uri)
        if stored is None:
            detector = TfidfDetector.train(train["text"].to_list(), train["label"].to_numpy())
            with mlflow_tracker.run_for(context, params=params) as run:
                scores = detector.score(texts)
                metrics = {
                    "fit_s": float(detector.fit_seconds or 0.0),
                    **{f"test_{k}": v for k, v in point_metrics(y, scores).items()},
                }
                run.log_metrics(metrics)
                registered = register_reference(
                    detector, name, run.run_id, uri, corpus_name, metrics, "D2 TF-IDF+LR trained on the"
                )
            stored = memo.save(
                {
                    "record": {**registered.record(), "corpus": corpus_name, **metrics},
                    "metrics": metrics,
                    "scores": scores,
                    "aliases": {CURRENT_ALIAS: registered.version},
                    "mlflow_run_id": run.run_id,
                }
            )
        record, metrics = stored["record"], stored["metrics"]
        yield Output(record, metadata=_registration_metadata(name, record["version"], stored, metrics))
        scores = np.asarray(stored["scores"], dtype=np.float64)
        yield _same_scores_check(REGISTRY_CHECK, name, uri, record["version"], texts, scores, 1e-9)

    return _d2


class D4TrainConfig(Config):
    """Seed epochs unless overridden; ``max_train_samples`` subsamples (stratified) for quick runs."""

    epochs: int | None = Field(default=None, description="Default: the paper's (3; 2 for the combined corpus).")
    max_train_samples: int | None = Field(default=None, description="Stratified subsample of the training split.")
    progress: bool = True


def _d4_asset(corpus_name: str) -> AssetsDefinition:
    key = f"detector_d4_{corpus_name}"

    @asset(
        code_version=CODE_VERSION,
        name=key,
        group_name=GROUP,
        ins={"corpus_frame": AssetIn(key=f"detector_corpus_{corpus_name}")},
        description=f"D4: all-MiniLM-L6-v2 from the model store, lower layers frozen, fine-tuned on the "
        f"'{corpus_name}' training split (deterministic seed); logged as an mlflow.pyfunc model wrapping "
        f"safetensors weights and registered as {registered_name('d4', corpus_name)} (alias 'current'); the same "
        "model exported to ONNX Runtime (fused graph, int8 weights) is a second version of it (alias 'onnx').",
        kinds={"pytorch", "mlflow", "onnx"},
        check_specs=[
            AssetCheckSpec(
                REGISTRY_CHECK,
                asset=key,
                blocking=True,
                description="The registered model loads by name and gives the trained model's scores.",
            ),
            AssetCheckSpec(
                ONNX_CHECK,
                asset=key,
                description=f"The ONNX Runtime int8 version (alias 'onnx') loads by name, gives the exported "
                f"graph's scores, and its test F1 is within {ONNX_F1_TOLERANCE_POINTS} point of the PyTorch "
                "reference's (max |score difference| and flipped decisions in the metadata).",
            ),
        ],
    )
    def _d4(
        context: AssetExecutionContext,
        config: D4TrainConfig,
        corpus_frame: pl.DataFrame,
        mlflow_tracker: MlflowTrackerResource,
        model_store: ModelStoreResource,
    ):
        corpus = _corpus(corpus_name, corpus_frame)
        train = stratified_subsample(corpus.part("train"), config.max_train_samples)
        settings = settings_for(corpus_name, **({"epochs": config.epochs} if config.epochs else {}))
        resolved = model_store.resolve(ENCODER_ROLE)
        encoder = EncoderRef(resolved.name, resolved.path, resolved.sha256)
        texts, y = corpus.texts("test"), corpus.labels("test")
        uri = mlflow_tracker.tracker().tracking_uri
        params = {
            "corpus": corpus_name,
            "detector": "D4",
            "n_train": train.height,
            "n_test": len(y),
            "encoder": encoder.name,
            "encoder_sha256": encoder.sha256,
            **settings.params(),
        }
        name = registered_name("d4", corpus_name)
        memo = ResultMemo.default().entry(key, _registration_parts(params, corpus_frame, uri, name), code=__name__)
        stored = _reused_registration(context, memo, name, uri)
        if stored is None:
            with mlflow_tracker.run_for(context, params=params) as run:
                done = train_and_register_d4(
                    train["text"].to_list(),
                    train["label"].to_numpy(),
                    texts,
                    y,
                    encoder=encoder,
                    settings=settings,
                    name=name,
                    corpus_name=corpus_name,
                    run_id=run.run_id,
                    tracking_uri=uri,
                    log_metrics=run.log_metrics,
                    progress=config.progress,
                )
            context.log.info(
                f"D4 {corpus_name}: fine-tuned {train.height} texts in {done.wall_seconds:.1f}s, "
                f"test F1 {done.metrics['test_f1']:.4f}"
            )
            stored = memo.save(
                {
                    "record": {
                        **done.reference.record(),
                        "corpus": corpus_name,
                        **done.metrics,
                        "onnx_version": done.onnx.version,
                    },
                    "metrics": {**done.metrics, **done.onnx_metrics},
                    "scores": done.scores,
                    "fast_scores": done.fast_scores,
                    "agreement": done.agreement,
                    "aliases": {CURRENT_ALIAS: done.reference.version, ONNX_ALIAS: done.onnx.version},
                    "mlflow_run_id": run.run_id,
                }
            )
        record, aliases, agreed_now = stored["record"], stored["aliases"], stored["agreement"]
        metadata = _registration_metadata(name, aliases[CURRENT_ALIAS], stored, stored["metrics"])
        yield Output(record, metadata={**metadata, "onnx_version": aliases[ONNX_ALIAS]})
        scores = np.asarray(stored["scores"], dtype=np.float64)
        yield _same_scores_check(
            REGISTRY_CHECK,
            name,
            uri,
            aliases[CURRENT_ALIAS],
            texts[:SCORE_CHECK_TEXTS],
            scores[:SCORE_CHECK_TEXTS],
            1e-6,
        )
        reloaded = _same_scores_check(
            ONNX_CHECK,
            name,
            uri,
            aliases[ONNX_ALIAS],
            texts,
            np.asarray(stored["fast_scores"], dtype=np.float64),
            1e-6,
        )
        change = float(agreed_now["f1_change_points"])
        yield AssetCheckResult(
            check_name=ONNX_CHECK,
            passed=bool(reloaded.passed) and abs(change) <= ONNX_F1_TOLERANCE_POINTS,
            metadata={
                **(reloaded.metadata or {}),
                "f1_change_points": change,
                "max_abs_score_diff_vs_pytorch": float(agreed_now["max_abs_diff"]),
                "decision_flips": int(agreed_now["decision_flips"]),
            },
        )

    return _d4


class DetectorEvalConfig(Config):
    """Bootstrap and latency settings; ``max_test_samples`` subsamples (stratified) for quick runs."""

    n_bootstrap: int = 1000
    n_single_latency: int = 20
    max_test_samples: int | None = None
    pretrained: str = Field(
        default="auto",
        description="D3: auto (protectai when the hub is reachable, else NanoGuard), protectai, or nanoguard.",
    )


def _png_markdown(path: Path) -> str:
    return f"![ROC curves](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()})"


def _evaluation_asset(corpus_name: str) -> AssetsDefinition:
    key = f"detector_evaluation_{corpus_name}"
    checks = [
        AssetCheckSpec(
            "table_complete",
            asset=key,
            blocking=True,
            description="Rows D1-D5, each metric and its 95% CI bounds in [0, 1] with low <= high.",
        )
    ]
    if corpus_name in PAPER_GOAL_F1:
        checks.append(
            AssetCheckSpec(
                "seed_f1_goal",
                asset=key,
                description=f"Best of D4/D5 F1 >= the paper's {PAPER_GOAL_F1[corpus_name]:.2%} "
                "(warns; reports the gap).",
            )
        )

    @asset(
        code_version=CODE_VERSION,
        name=key,
        group_name=GROUP,
        ins={
            "corpus_frame": AssetIn(key=f"detector_corpus_{corpus_name}"),
            "d2": AssetIn(key=f"detector_d2_{corpus_name}"),
            "d4": AssetIn(key=f"detector_d4_{corpus_name}"),
        },
        description=f"Seed 002 Table for the '{corpus_name}' corpus: D1-D5 on its test split with accuracy, precision, "
        "recall, F1, AUROC and bootstrap 95% CIs, latency single/batched, training time; D2 and D4 loaded from "
        "the MLflow registry by name; ROC curves as an image here and in MLflow.",
        kinds={"polars", "parquet", "mlflow"},
        check_specs=checks,
    )
    def _evaluation(
        context: AssetExecutionContext,
        config: DetectorEvalConfig,
        corpus_frame: pl.DataFrame,
        d2: dict,
        d4: dict,
        mlflow_tracker: MlflowTrackerResource,
    ):
        corpus = _corpus(corpus_name, corpus_frame)
        uri = mlflow_tracker.tracker().tracking_uri
        d2_detector = load_registered_detector(d2["registered_name"], uri)  # alias 'current'
        d4_detector = load_registered_detector(d4["registered_name"], uri)
        pretrained = load_pretrained_detector(config.pretrained)  # type: ignore[arg-type]
        d3_note = f"{pretrained.chosen} ({pretrained.reason})"
        if corpus_name in ("deepset", "combined"):
            d3_note += f"; trained on deepset: {pretrained.record.get('trained_on_deepset', 'unknown')}"
        versions = {
            "d2_version": registered_ref(d2_detector).version,
            "d4_version": registered_ref(d4_detector).version,
        }
        params = {
            "corpus": corpus_name,
            "n_bootstrap": config.n_bootstrap,
            "n_single_latency": config.n_single_latency,
            "max_test_samples": config.max_test_samples,
            "d2_model": d2["registered_name"],
            "d4_model": d4["registered_name"],
            "d3_model": pretrained.record.get("model"),
            "d3_choice": pretrained.chosen,
            "d3_reason": pretrained.reason,
            **versions,
        }
        roc_path = state_dir() / "detectors" / corpus_name / "roc.png"
        with mlflow_tracker.run_for(context, params=params) as run:
            evaluation = evaluate_corpus(
                corpus,
                d2=d2_detector,
                d4=d4_detector,
                d3=pretrained.detector,
                roc_path=roc_path,
                train_seconds={"D2": d2["fit_s"], "D4": d4["finetune_wall_s"]},
                notes={"D3": d3_note},
                max_test=config.max_test_samples,
                n_single=config.n_single_latency,
                n_resamples=config.n_bootstrap,
            )
            run.log_metrics(evaluation.metrics())
            table_md = roc_path.with_name("table.md")
            table_md.write_text(f"# {corpus_name}\n\n{evaluation.markdown}\n")
            evaluation.table.write_csv(roc_path.with_name("table.csv"))
            for path in (roc_path, table_md, roc_path.with_name("table.csv")):
                run.log_artifact(path, "evaluation")
        context.log.info(f"{corpus_name}:\n{evaluation.markdown}")
        yield Output(
            evaluation.table,
            metadata={
                "dagster/row_count": evaluation.table.height,
                "table": MetadataValue.md(evaluation.markdown),
                "roc_curve": MetadataValue.md(_png_markdown(roc_path)),
                "roc_path": MetadataValue.path(str(roc_path)),
                "mlflow_run_id": run.run_id,
                "n_test": evaluation.n_test,
                "d3": d3_note,
                **versions,
            },
        )
        names = ("accuracy", "precision", "recall", "f1", "auroc")
        rows = list(evaluation.table.iter_rows(named=True))
        valid = all(
            0.0 <= row[f"{m}_ci_low"] <= row[f"{m}_ci_high"] <= 1.0 and 0.0 <= row[m] <= 1.0
            for row in rows
            for m in names
        )
        inside = all(row[f"{m}_ci_low"] - 1e-12 <= row[m] <= row[f"{m}_ci_high"] + 1e-12 for row in rows for m in names)
        yield AssetCheckResult(
            check_name="table_complete",
            passed=valid and [r["detector"][:2] for r in rows] == list(ORDER),
            metadata={"rows": len(rows), "every_point_inside_its_ci": inside},
        )
        if corpus_name in PAPER_GOAL_F1:
            best = max(evaluation.results["D4"].metrics["f1"], evaluation.results["D5"].metrics["f1"])
            goal = PAPER_GOAL_F1[corpus_name]
            yield AssetCheckResult(
                check_name="seed_f1_goal",
                passed=best >= goal,
                severity=AssetCheckSeverity.WARN,
                metadata={
                    "best_d4_d5_f1": best,
                    "goal": goal,
                    "gap_pp": (goal - best) * 100,
                    "n_test": evaluation.n_test,
                },
            )

    return _evaluation


LODO_KEY = "detector_leave_one_dataset_out"


class LodoConfig(Config):
    """Bootstrap resamples and D3 choice; ``max_test_samples`` subsamples each test split (quick runs)."""

    n_bootstrap: int = 1000
    max_test_samples: int | None = None
    pretrained: str = Field(default="auto", description="D3: auto, protectai or nanoguard (as the evaluations).")


def _lodo_asset() -> AssetsDefinition:
    ins = {f"corpus_{d}": AssetIn(key=f"detector_corpus_{d}") for d in LODO_DATASETS}
    ins |= {f"{kind}_{d}": AssetIn(key=f"detector_{kind}_{d}") for kind in ("d2", "d4") for d in LODO_DATASETS}

    @asset(
        code_version=CODE_VERSION,
        name=LODO_KEY,
        group_name=GROUP,
        ins=ins,
        description="Leave one data set out: D2, D4 (the registered models, trained on one data "
        f"set's training split) and D5 tested on the other data set's test split, for {' and '.join(LODO_DATASETS)} "
        "(TrustAIRLab and awesome-chatgpt-prompts have one label each, so they count as one data set); D3 "
        "zero-shot; the in-domain diagonal as reference. F1 with bootstrap 95% CIs, logged to MLflow.",
        kinds={"polars", "parquet", "mlflow"},
    )
    def _lodo(context: AssetExecutionContext, config: LodoConfig, mlflow_tracker: MlflowTrackerResource, **inputs):
        uri = mlflow_tracker.tracker().tracking_uri
        corpora = {d: _corpus(d, inputs[f"corpus_{d}"]) for d in LODO_DATASETS}
        models = {
            d: (
                load_registered_detector(inputs[f"d2_{d}"]["registered_name"], uri),
                load_registered_detector(inputs[f"d4_{d}"]["registered_name"], uri),
            )
            for d in LODO_DATASETS
        }
        seconds = {
            d: {"D2": inputs[f"d2_{d}"]["fit_s"], "D4": inputs[f"d4_{d}"]["finetune_wall_s"]} for d in LODO_DATASETS
        }
        pretrained = load_pretrained_detector(config.pretrained)  # type: ignore[arg-type]
        params = {
            "datasets": ",".join(LODO_DATASETS),
            "n_bootstrap": config.n_bootstrap,
            "max_test_samples": config.max_test_samples,
            "d3_model": pretrained.record.get("model"),
            "d3_choice": pretrained.chosen,
            **{
                f"{kind}_{d}_model": inputs[f"{kind}_{d}"]["registered_name"]
                for kind in ("d2", "d4")
                for d in LODO_DATASETS
            },
            **{
                f"{kind}_{d}_version": registered_ref(models[d][i]).version
                for i, kind in enumerate(("d2", "d4"))
                for d in LODO_DATASETS
            },
        }
        folder = state_dir() / "detectors" / "leave_one_dataset_out"
        folder.mkdir(parents=True, exist_ok=True)
        with mlflow_tracker.run_for(context, params=params) as run:
            result = leave_one_dataset_out(
                corpora,
                d3=pretrained.detector,
                models=models,
                settings=LodoSettings(max_test=config.max_test_samples, n_resamples=config.n_bootstrap),
                train_seconds=seconds,
                log=context.log.info,
            )
            run.log_metrics(result.metrics())
            (folder / "table.md").write_text(f"# Leave one data set out (F1 [95% CI])\n\n{result.markdown}\n")
            result.table.write_csv(folder / "table.csv")
            for path in (folder / "table.md", folder / "table.csv"):
                run.log_artifact(path, "evaluation")
        context.log.info(f"leave one data set out:\n{result.markdown}")
        return Output(
            result.table,
            metadata={
                "dagster/row_count": result.table.height,
                "table": MetadataValue.md(result.markdown),
                "mlflow_run_id": run.run_id,
                "d3": f"{pretrained.chosen} ({pretrained.reason})",
            },
        )

    return _lodo


class DetectorValidityConfig(Config):
    quick: bool = Field(default=False, description="small samples and one epoch: a smoke run, not results")
    pairs: dict[str, int] = Field(
        default={str(k): v for k, v in BURIED_PAIRS.items()}, description="buried injection pairs per length (tokens)"
    )
    max_per_class: int = Field(default=300, ge=1, description="production training examples per source and label")
    lodo_documents: int = Field(default=150, ge=1, description="held-out documents per source and label (selection)")


@asset(
    code_version=CODE_VERSION,
    tags=FULL_STUDY,
    group_name=VALIDITY_GROUP,
    kinds={"pytorch", "onnx", "mlflow"},
    description="Detectors off their training distribution: D1-D5, the production detector (leave-one-source-out "
    "selection on training data, threshold on calibration) and a length control on held-out sources, the "
    "over-defense set, benign tool outputs, buried injections, German, latency; every column with its n and CI. "
    "Reads the data catalog; writes detector_validity.md (stamped) / .json (`make detector-validity`; an hour).",
)
def detector_validity(
    context: AssetExecutionContext, config: DetectorValidityConfig, mlflow_tracker: MlflowTrackerResource
):
    from rvu_pipelines.detectors.validity_run import ValidityOptions, ValidityReport, run_validity

    out = state_dir() / "detectors"

    def study() -> ValidityReport:
        options = ValidityOptions(
            quick=config.quick,
            pairs={int(k): v for k, v in config.pairs.items()},
            max_per_class=config.max_per_class,
            lodo_documents=config.lodo_documents,
        )
        return run_validity(options, out, command=launched_command(context, config), say=context.log.info)

    report, metadata = run_full_study(
        context,
        mlflow_tracker,
        config,
        study,
        out=out,
        page="detector_validity.md",
        artifacts=("detector_validity.md", "detector_validity.json"),
        metrics=lambda report: {
            name: value
            for row in report.table.iter_rows(named=True)
            for name, value in numeric_metrics(
                {k: v for k, v in row.items() if k != "detector"}, prefix=str(row["detector"])
            ).items()
        },
    )
    return Output(report.table, metadata=metadata)


def quick_run_config(max_train_samples: int = 40, max_test_samples: int = 20, epochs: int = 1) -> dict:
    """Run config for a fast smoke materialization of every detector asset (stratified subsamples,
    NanoGuard as D3, 100 bootstrap resamples); the default config is the full evaluation."""
    ops: dict = {}
    for corpus in CORPUS_NAMES:
        ops[f"detector_d2_{corpus}"] = {"config": {"max_train_samples": max_train_samples}}
        ops[f"detector_d4_{corpus}"] = {
            "config": {"epochs": epochs, "max_train_samples": max_train_samples, "progress": False}
        }
        ops[f"detector_evaluation_{corpus}"] = {
            "config": {
                "max_test_samples": max_test_samples,
                "n_bootstrap": 100,
                "n_single_latency": 2,
                "pretrained": "nanoguard",
            }
        }
    ops[LODO_KEY] = {"config": {"max_test_samples": max_test_samples, "n_bootstrap": 100, "pretrained": "nanoguard"}}
    return {"ops": ops}


def detector_assets() -> list[AssetsDefinition]:
    """Corpora, D2/D4 per corpus (trained + registered), one evaluation per corpus, leave one data set out, and the
    production detector."""
    from assets.production_detector import production_detector  # imports this module's neighbours only

    return [
        *(
            factory(name)
            for factory in (_corpus_asset, _d2_asset, _d4_asset, _evaluation_asset)
            for name in CORPUS_NAMES
        ),
        _lodo_asset(),
        production_detector,
        detector_validity,
    ]


detectors_job = define_asset_job(
    "detectors_job",
    selection=AssetSelection.groups("detectors").upstream(),
    executor_def=JOB_EXECUTOR,
    description="Seed 002 §5-6: build the three corpora, train and register D2/D4 per corpus in MLflow, and "
    "evaluate D1-D5 with bootstrap CIs (tens of minutes of CPU; `make detectors`).",
)


detector_validity_job = define_asset_job(
    "detector_validity_job",
    selection=AssetSelection.assets("detector_validity"),
    executor_def=JOB_EXECUTOR,
    description="The detector validity table (`make detector-validity`; config `quick` for a smoke run): every "
    "detector off its training distribution, the production detector's selection and calibration.",
)


def detector_jobs() -> list:
    return [detectors_job, detector_validity_job]
