"""Prompt-injection detectors D1-D5 of seed 002 §5-6: corpora, training, evaluation, MLflow registry.

Every detector implements :class:`InjectionDetector` (``name``, ``score(texts)`` -> P(injection),
``predict(texts, threshold)``); that is the one interface the recovery pipeline, the memory
monitor's USER-channel check and the attack harness consume, chosen by name through
:func:`rvu_pipelines.detectors.catalog.by_name` (``rvu detectors`` lists the names).
:class:`ExfiltrationHeuristic` is recovery's default signal. Plain Python: torch, transformers and MLflow
are imported only inside the functions that need them.
"""

from rvu_pipelines.detectors.base import (
    DEFAULT_THRESHOLD,
    DetectorBase,
    InjectionDetector,
    as_contamination_detector,
    as_text_scorer,
)
from rvu_pipelines.detectors.corpora import (
    CORPUS_NAMES,
    SOURCE_DATASETS,
    Corpus,
    build_corpus,
    combined_corpus,
    deepset_corpus,
    jackhhao_corpus,
    jailbreak_corpus,
    load_corpora,
)
from rvu_pipelines.detectors.ensemble import EnsembleDetector, seed_ensemble
from rvu_pipelines.detectors.evaluation import CorpusEvaluation, evaluate_corpus
from rvu_pipelines.detectors.exfiltration import ExfiltrationHeuristic
from rvu_pipelines.detectors.finetune import (
    FinetunedDetector,
    FinetuneReport,
    FinetuneSettings,
    finetune,
    resolve_encoder,
    settings_for,
)
from rvu_pipelines.detectors.heuristic import HeuristicDetector
from rvu_pipelines.detectors.metrics import bootstrap_cis, evaluate_detector, plot_roc, point_metrics
from rvu_pipelines.detectors.pretrained import (
    HubClassifierDetector,
    NanoGuardDetector,
    RestrictedUnpickler,
    load_pretrained_detector,
    load_tiktoken_encoding,
)
from rvu_pipelines.detectors.registry import (
    RegisteredDetector,
    load_registered_detector,
    register_detector,
    registered_name,
)
from rvu_pipelines.detectors.tfidf import TfidfDetector

__all__ = [
    "CORPUS_NAMES",
    "DEFAULT_THRESHOLD",
    "SOURCE_DATASETS",
    "Corpus",
    "CorpusEvaluation",
    "DetectorBase",
    "EnsembleDetector",
    "ExfiltrationHeuristic",
    "FinetuneReport",
    "FinetuneSettings",
    "FinetunedDetector",
    "HeuristicDetector",
    "HubClassifierDetector",
    "InjectionDetector",
    "NanoGuardDetector",
    "RegisteredDetector",
    "RestrictedUnpickler",
    "TfidfDetector",
    "as_contamination_detector",
    "as_text_scorer",
    "bootstrap_cis",
    "build_corpus",
    "combined_corpus",
    "deepset_corpus",
    "evaluate_corpus",
    "evaluate_detector",
    "finetune",
    "jackhhao_corpus",
    "jailbreak_corpus",
    "load_corpora",
    "load_pretrained_detector",
    "load_registered_detector",
    "load_tiktoken_encoding",
    "plot_roc",
    "point_metrics",
    "register_detector",
    "registered_name",
    "resolve_encoder",
    "seed_ensemble",
    "settings_for",
]
