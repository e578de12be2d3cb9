"""D4 from a corpus to the registry: fine-tune, score the test split, register the PyTorch reference (alias
``current``), export it to ONNX Runtime (fused graph, int8 weights), check the export agrees, register that as the
next version (alias ``onnx``). The ``detector_d4_<corpus>`` assets call it inside their MLflow run."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rvu_pipelines.detectors.base import DetectorBase
from rvu_pipelines.detectors.finetune import EncoderRef, FinetuneSettings, finetune
from rvu_pipelines.detectors.metrics import point_metrics
from rvu_pipelines.detectors.onnx_d4 import OnnxDetector, agreement, export_detector
from rvu_pipelines.detectors.registry import ONNX_ALIAS, RegisteredDetector, register_detector


@dataclass(frozen=True)
class D4Registration:
    """What one training registered: both versions, the reference's metrics (training report + test split), the
    ONNX version's, and both models' test scores."""

    reference: RegisteredDetector
    onnx: RegisteredDetector
    metrics: dict[str, float]
    onnx_metrics: dict[str, float]
    scores: np.ndarray
    fast_scores: np.ndarray
    agreement: dict[str, float]
    wall_seconds: float


def register_reference(
    detector: DetectorBase, name: str, run_id: str, uri: str, corpus_name: str, metrics: dict, what: str
) -> RegisteredDetector:
    """Register a trained (reference) model as the next version of ``name``, alias 'current'."""
    return register_detector(
        detector,
        name=name,
        run_id=run_id,
        tracking_uri=uri,
        tags={"corpus": corpus_name, "test_f1": metrics["test_f1"]},
        description=f"{what} {corpus_name} training split.",
    )


def train_and_register_d4(
    train_texts: Sequence[str],
    train_labels: np.ndarray,
    test_texts: Sequence[str],
    test_labels: np.ndarray,
    *,
    encoder: EncoderRef,
    settings: FinetuneSettings,
    name: str,
    corpus_name: str,
    run_id: str,
    tracking_uri: str,
    log_metrics: Callable[[dict[str, float]], None],
    progress: bool = True,
) -> D4Registration:
    """Both versions of D4 on one corpus, registered under ``name`` against MLflow run ``run_id``; every metric
    goes to ``log_metrics`` as it is measured."""
    detector, report = finetune(list(train_texts), train_labels, encoder=encoder, settings=settings, progress=progress)
    scores = detector.score(list(test_texts))
    metrics = {**report.metrics(), **{f"test_{k}": v for k, v in point_metrics(test_labels, scores).items()}}
    log_metrics(metrics)
    registered = register_reference(
        detector, name, run_id, tracking_uri, corpus_name, metrics, "D4 MiniLM fine-tuned on the"
    )
    with tempfile.TemporaryDirectory() as tmp:
        fast = OnnxDetector.load(export_detector(detector, Path(tmp)), "int8", encoder=encoder)
        fast_scores = fast.score(list(test_texts))
        agreed = agreement(scores, fast_scores, test_labels)
        onnx_metrics = {
            "onnx_int8_test_f1": float(agreed.f1_candidate or 0.0),
            "onnx_int8_max_abs_diff": agreed.max_abs_diff,
            "onnx_int8_decision_flips": float(agreed.decision_flips),
        }
        log_metrics(onnx_metrics)
        onnx_registered = register_detector(
            fast,
            name=name,
            run_id=run_id,
            tracking_uri=tracking_uri,
            tags={"corpus": corpus_name, "runtime": "onnxruntime-int8", **onnx_metrics},
            description=f"D4 ({corpus_name}) on ONNX Runtime: fused graph, int8 weights.",
            alias=ONNX_ALIAS,
        )
    return D4Registration(
        reference=registered,
        onnx=onnx_registered,
        metrics=metrics,
        onnx_metrics=onnx_metrics,
        scores=scores,
        fast_scores=fast_scores,
        agreement={
            "f1_change_points": agreed.f1_change_points or 0.0,
            "max_abs_diff": agreed.max_abs_diff,
            "decision_flips": agreed.decision_flips,
        },
        wall_seconds=report.wall_seconds,
    )
