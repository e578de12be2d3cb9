"""The production injection detector as an asset: trained by the recipe in ``rvu_pipelines.detectors.production``,
calibrated on benign tool outputs, served as ONNX int8 and registered as ``rvu-injection-detector@production``.

Thin wrapper: the library trains, calibrates, exports and registers; this asset records the run in MLflow,
reuses an unchanged result, and checks that the registered version loads by alias and scores as trained.
"""

import tempfile
from pathlib import Path

import numpy as np
import polars as pl
from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, AssetIn, Config, Output, asset
from pydantic import Field

from resources import MlflowTrackerResource, ModelStoreResource
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.detectors.corpora import Corpus
from rvu_pipelines.detectors.deployment_texts import load_deployment_texts
from rvu_pipelines.detectors.finetune import ENCODER_ROLE, EncoderRef, FinetuneSettings
from rvu_pipelines.detectors.overdefense import build_overdefense_set
from rvu_pipelines.detectors.production import (
    PRODUCTION_ALIAS,
    PRODUCTION_NAME,
    REFERENCE_ALIAS,
    RecipeSettings,
    evaluation_documents,
    export_production,
    register_production,
    train_production,
)
from rvu_pipelines.detectors.registry import load_registered_detector, reinstate_versions
from rvu_pipelines.result_memo import ResultMemo, frame_digest, reuse_message

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

GROUP = "detectors"
KEY = "detector_production"
LOADS_CHECK = "production_alias_loads_and_scores"
CHECK_TEXTS = 32


class ProductionDetectorConfig(Config):
    """How much the recipe trains on; the defaults are the setting leave-one-source-out chose in
    ``make detector-validity`` (one trainable layer, two epochs, 300 examples per source and label)."""

    max_per_class: int | None = Field(default=300, description="Training examples per source and label.")
    trainable_layers: int = Field(default=1, description="Top encoder layers trained (0 = the head only).")
    epochs: int = 2
    calibration_outputs: int | None = Field(
        default=None, description="Benign tool outputs the threshold is calibrated on (a seeded sample; None: all)."
    )
    progress: bool = False


@asset(
    code_version=CODE_VERSION,
    name=KEY,
    group_name=GROUP,
    ins={
        "deepset_frame": AssetIn(key="detector_corpus_deepset"),
        "jailbreak_frame": AssetIn(key="detector_corpus_jailbreak"),
    },
    deps=["bipia", "injecagent", "agentdojo_suites"],
    description=f"The production prompt-injection detector: MiniLM fine-tuned on every detector corpus, the "
    "deployment's benign tool outputs (windows) with planted payloads, and benign trigger-word sentences; "
    "threshold calibrated to 1 % FPR on benign tool outputs and folded into the scores (0.5 = operating point); "
    f"served as ONNX int8 and registered as {PRODUCTION_NAME} (alias '{PRODUCTION_ALIAS}', float model "
    f"'{REFERENCE_ALIAS}').",
    kinds={"pytorch", "mlflow", "onnx"},
    check_specs=[
        AssetCheckSpec(
            LOADS_CHECK,
            asset=KEY,
            blocking=True,
            description="The alias 'production' loads from the registry and gives the served graph's scores.",
        )
    ],
)
def production_detector(
    context: AssetExecutionContext,
    config: ProductionDetectorConfig,
    deepset_frame: pl.DataFrame,
    jailbreak_frame: pl.DataFrame,
    mlflow_tracker: MlflowTrackerResource,
    model_store: ModelStoreResource,
):
    corpora = {"deepset": Corpus("deepset", deepset_frame), "jailbreak": Corpus("jailbreak", jailbreak_frame)}
    deployment = load_deployment_texts()
    hard_negatives = build_overdefense_set().frame
    settings = RecipeSettings(
        finetune=FinetuneSettings(trainable_layers=config.trainable_layers, epochs=config.epochs),
        max_per_class=config.max_per_class,
        calibration_outputs=config.calibration_outputs,
    )
    resolved = model_store.resolve(ENCODER_ROLE)
    encoder = EncoderRef(resolved.name, resolved.path, resolved.sha256)
    uri = mlflow_tracker.tracker(GROUP).tracking_uri
    documents = evaluation_documents(corpora, deployment).sort("id")
    check_texts = documents.sample(min(CHECK_TEXTS, documents.height), seed=42)["text"].to_list()
    params = {"detector": "production", "encoder": encoder.name, "encoder_sha256": encoder.sha256, **settings.params()}
    parts = {
        "params": params,
        "corpora": [frame_digest(deepset_frame), frame_digest(jailbreak_frame)],
        "deployment": [frame_digest(f) for f in (deployment.benign, deployment.payloads, deployment.injected)],
        "hard_negatives": frame_digest(hard_negatives),
        "registry": uri,
    }
    memo = ResultMemo.default().entry(KEY, parts, code=__name__)
    stored = memo.load()
    if stored is not None and reinstate_versions(PRODUCTION_NAME, uri, dict(stored["aliases"])):
        context.log.info(f"{reuse_message(stored)}: {PRODUCTION_NAME} versions {stored['aliases']}")
        stored = {**stored, "reused": True}
    else:
        with mlflow_tracker.run_for(context, params=params) as run:
            production = train_production(
                corpora, deployment, hard_negatives, settings=settings, encoder=encoder, progress=config.progress
            )
            with tempfile.TemporaryDirectory() as tmp:
                served = export_production(production, Path(tmp) / "onnx")
                scores = served.detector.score(check_texts)
                record = register_production(production, served, run_id=run.run_id, tracking_uri=uri)
            metrics = {**production.metrics(), **{f"served_{k}": v for k, v in served.calibration.record().items()}}
            run.log_metrics(metrics)
        stored = memo.save(
            {
                "record": record,
                "metrics": metrics,
                "scores": scores,
                "aliases": {
                    PRODUCTION_ALIAS: record["production"]["version"],  # type: ignore[index]
                    REFERENCE_ALIAS: record["reference"]["version"],  # type: ignore[index]
                },
                "mlflow_run_id": run.run_id,
            }
        )
    metrics = {k: float(v) for k, v in stored["metrics"].items()}
    yield Output(
        stored["record"],
        metadata={
            "registered_name": PRODUCTION_NAME,
            "production_version": stored["aliases"][PRODUCTION_ALIAS],
            "reference_version": stored["aliases"][REFERENCE_ALIAS],
            "mlflow_run_id": stored["mlflow_run_id"],
            "reused_unchanged_result": bool(stored.get("reused")),
            **metrics,
        },
    )
    loaded = load_registered_detector(PRODUCTION_NAME, uri, alias=PRODUCTION_ALIAS)
    diff = float(np.max(np.abs(loaded.score(check_texts) - np.asarray(stored["scores"], dtype=np.float64))))
    yield AssetCheckResult(
        check_name=LOADS_CHECK,
        passed=diff <= 1e-6,
        metadata={"version": stored["aliases"][PRODUCTION_ALIAS], "texts": len(check_texts), "max_abs_diff": diff},
    )
