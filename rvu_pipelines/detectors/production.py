"""The production injection detector: one recipe that is meant to hold up off its training distribution.

Threat model and timeline. The detector screens text an agent is about to read (tool outputs, retrieved
documents, USER-channel memory writes). The attacker controls the injected text and where it sits in a
long tool output; the defender decides with the detector's score alone, before the text reaches the
model. At training time the defender has the public corpora in the data mirror, the benign tool outputs of
its own deployment (the benchmarks' training splits) and hard benign negatives; it has never seen the
held-out sources, the over-defense set or the buried-injection set it is evaluated on.

Recipe (:func:`train_production`):

* **Training examples** (:func:`training_examples`): every detector corpus's training split (deepset,
  jailbreak), the deployment's benign tool outputs cut into the windows the detector scores, the same
  windows with a training payload planted at a random word boundary (positives), the benchmarks' own
  injected tool outputs where they fit one window, and benign documentation sentences that use trigger
  words in ordinary senses (hard negatives, :mod:`overdefense`'s training part). Counts are capped per
  source and label (``max_per_class``) so no source dominates.
* **Model selection by leave-one-source-out** (:func:`select_settings`): for each candidate setting and
  each source with both labels, train on the other sources and score the held-out source's *test* split
  as documents (windowed max). The setting with the best worst-source AUROC wins; the in-distribution test
  split is never used to choose.
* **Threshold calibrated on the deployment** (:func:`calibrate`): on the benign tool outputs of the
  calibration split, the lowest threshold that flags at most ``target_fpr`` (1 %) of them. The threshold
  is folded into the model as a logit offset, so every consumer's 0.5 is the calibrated operating point.
* Served as ONNX Runtime int8 (:mod:`onnx_d4`) and registered as ``rvu-injection-detector`` with alias
  ``production``; the float PyTorch model is the ``reference`` version of the same name.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from rvu_pipelines.detectors.base import InjectionDetector, tokenizer_window_spans
from rvu_pipelines.detectors.catalog import PRODUCTION_CHOICE, detector_plugin
from rvu_pipelines.detectors.corpora import Corpus
from rvu_pipelines.detectors.finetune import EncoderRef, FinetunedDetector, FinetuneSettings
from rvu_pipelines.errors import DetectorError

PRODUCTION_NAME = "rvu-injection-detector"
PRODUCTION_ALIAS = "production"
REFERENCE_ALIAS = "reference"
TARGET_FPR = 0.01
CORPUS_SOURCES: tuple[str, ...] = ("deepset", "jailbreak")
DEPLOYMENT_SOURCES: tuple[str, ...] = ("agentdojo", "bipia", "injecagent")
LODO_SOURCES: tuple[str, ...] = CORPUS_SOURCES + DEPLOYMENT_SOURCES
HARD_NEGATIVES = "overdefense"
EXAMPLE_COLUMNS = {"id": pl.String, "text": pl.String, "label": pl.Int8, "source": pl.String, "split": pl.String}


@dataclass(frozen=True)
class RecipeSettings:
    """What the recipe trains and how much data it takes; ``finetune`` is the model's own settings."""

    finetune: FinetuneSettings = field(default_factory=lambda: FinetuneSettings(trainable_layers=1, epochs=2))
    max_per_class: int | None = 300  # training examples per source and label
    windows_per_document: int = 2  # benign windows drawn from each training document
    contexts_per_payload: int = 6  # positives built from each training payload
    calibration_outputs: int | None = None  # benign outputs of the calib split the threshold is set on (None: all)
    target_fpr: float = TARGET_FPR
    seed: int = 42

    def __post_init__(self) -> None:
        if not 0.0 < self.target_fpr < 0.5:
            raise DetectorError(f"RecipeSettings.target_fpr={self.target_fpr}: use a rate in (0, 0.5), e.g. 0.01.")
        if self.max_per_class is not None and self.max_per_class < 2:
            raise DetectorError(f"RecipeSettings.max_per_class={self.max_per_class}: use at least 2, or None.")
        if self.calibration_outputs is not None and self.calibration_outputs < 20:
            raise DetectorError(
                f"RecipeSettings.calibration_outputs={self.calibration_outputs}: a threshold at "
                f"{self.target_fpr:.0%} FPR needs at least 20 benign outputs; use more, or None for all."
            )

    @property
    def window_tokens(self) -> int:
        return self.finetune.max_length - 2  # [CLS] and [SEP] of the encoder's tokenizer

    def params(self) -> dict[str, object]:
        flat = {f"recipe_{k}": v for k, v in asdict(self).items() if k != "finetune"}
        return flat | self.finetune.params()


CANDIDATES: tuple[FinetuneSettings, ...] = (  # what leave-one-source-out chooses between
    FinetuneSettings(trainable_layers=0, epochs=3),
    FinetuneSettings(trainable_layers=1, epochs=2),
)


def _rng(seed: int, *key: object) -> np.random.Generator:
    digest = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


def token_windows(tokenizer: Any, text: str, size: int) -> list[str]:
    """``text`` cut into the windows of ``size`` tokens the detector scores (half a window apart, at word
    boundaries: :func:`~rvu_pipelines.detectors.base.tokenizer_window_spans`)."""
    if not text.strip():
        return []
    max_length = size + int(tokenizer.num_special_tokens_to_add(pair=False))
    return [text[start:end] for start, end in tokenizer_window_spans(tokenizer, text, max_length)]


def plant(context: str, payload: str, rng: np.random.Generator) -> str:
    """``payload`` inserted at a random word boundary of ``context`` (start and end included)."""
    words = context.split(" ")
    at = int(rng.integers(0, len(words) + 1))
    return " ".join([*words[:at], payload, *words[at:]]).strip()


def _cap(frame: pl.DataFrame, n: int | None, seed: int) -> pl.DataFrame:
    if n is None or frame.height <= n:
        return frame
    return frame.sort("id").sample(n, seed=seed, shuffle=False).sort("id")


def training_examples(
    corpora: Mapping[str, Corpus],
    deployment: Any,
    hard_negatives: pl.DataFrame,
    tokenizer: Any,
    settings: RecipeSettings,
) -> pl.DataFrame:
    """The recipe's training split, one row per example (columns of ``EXAMPLE_COLUMNS``, split 'train')."""
    size = settings.window_tokens
    parts: list[pl.DataFrame] = []
    for name in CORPUS_SOURCES:
        train = corpora[name].part("train").select("id", "text", "label")
        parts.append(train.with_columns(source=pl.lit(name)))
    for source in DEPLOYMENT_SOURCES:
        benign = deployment.benign.filter((pl.col("source") == source) & (pl.col("split") == "train")).sort("id")
        payloads = deployment.payloads.filter((pl.col("source") == source) & (pl.col("split") == "train")).sort("id")
        if benign.is_empty() or payloads.is_empty():
            raise DetectorError(f"The deployment texts have no training {source} benign outputs or payloads.")
        windows: list[tuple[str, str]] = []
        for row in benign.iter_rows(named=True):
            found = token_windows(tokenizer, row["text"], size)
            rng = _rng(settings.seed, "benign", row["id"])
            picked = sorted(rng.choice(len(found), min(len(found), settings.windows_per_document), replace=False))
            windows += [(f"{row['id']}#w{int(i)}", found[int(i)]) for i in picked]
        rows: list[tuple[str, str, int]] = [(wid, text, 0) for wid, text in windows]
        for row in payloads.iter_rows(named=True):
            payload = token_windows(tokenizer, row["text"], size)[:1]
            if not payload:
                continue
            room = size - len(tokenizer(payload[0], add_special_tokens=False)["input_ids"])
            rng = _rng(settings.seed, "plant", row["id"])
            for k in range(settings.contexts_per_payload):
                wid, context = windows[int(rng.integers(0, len(windows)))]
                context = token_windows(tokenizer, context, max(room, 8))[0] if room >= 8 else ""
                rows.append((f"{row['id']}@{wid}#{k}", plant(context, payload[0], rng), 1))
        injected = deployment.injected.filter((pl.col("source") == source) & (pl.col("split") == "train"))
        for row in injected.sort("id").iter_rows(named=True):
            if len(token_windows(tokenizer, row["text"], size)) == 1:
                rows.append((row["id"], row["text"], 1))
        frame = pl.DataFrame(rows, schema={"id": pl.String, "text": pl.String, "label": pl.Int8}, orient="row")
        parts.append(frame.with_columns(source=pl.lit(source)))
    negatives = hard_negatives.filter(pl.col("split") == "train").select("id", "text")
    parts.append(negatives.with_columns(label=pl.lit(0, pl.Int8), source=pl.lit(HARD_NEGATIVES)))
    capped = []
    for part in parts:
        part = part.with_columns(pl.col("label").cast(pl.Int8)).unique("text", keep="first", maintain_order=True)
        for label in (0, 1):
            capped.append(_cap(part.filter(pl.col("label") == label), settings.max_per_class, settings.seed))
    out = pl.concat(capped).with_columns(split=pl.lit("train"))
    return out.select(list(EXAMPLE_COLUMNS)).cast(EXAMPLE_COLUMNS).sort("source", "id")  # type: ignore[arg-type]


def evaluation_documents(
    corpora: Mapping[str, Corpus], deployment: Any, splits: Sequence[str] = ("test",)
) -> pl.DataFrame:
    """Whole documents of each source's ``splits`` (benign outputs as label 0, the benchmark's own injected outputs
    as label 1; the corpora's texts), scored as the deployment scores them: windowed, not truncated. A source
    held out of training is unseen in every split, so leave-one-source-out scores all of them."""
    parts = []
    for name in CORPUS_SOURCES:
        for split in (s for s in splits if s in ("train", "test")):
            part = corpora[name].part(split).select("id", "text", "label")
            parts.append(part.with_columns(source=pl.lit(name), split=pl.lit(split)))
    for source in DEPLOYMENT_SOURCES:
        for frame, label in ((deployment.benign, 0), (deployment.injected, 1)):
            part = frame.filter((pl.col("source") == source) & pl.col("split").is_in(list(splits)))
            part = part.select("id", "text", "split").with_columns(label=pl.lit(label, pl.Int8), source=pl.lit(source))
            parts.append(part)
    out = pl.concat([p.select(list(EXAMPLE_COLUMNS)).cast(EXAMPLE_COLUMNS) for p in parts])  # type: ignore[arg-type]
    return out.sort("source", "split", "id")


def _auroc(y: np.ndarray, scores: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, scores)) if len(set(y.tolist())) == 2 else float("nan")


def bootstrap_auroc(y: np.ndarray, scores: np.ndarray, n_resamples: int = 1000, seed: int = 42) -> tuple[float, float]:
    """Percentile 95 % CI of AUROC, resampling positives and negatives separately (both classes in every draw)."""
    from sklearn.metrics import roc_auc_score

    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    if pos.size == 0 or neg.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_resamples):
        idx = np.concatenate([rng.choice(pos, pos.size), rng.choice(neg, neg.size)])
        draws.append(roc_auc_score(y[idx], scores[idx]))
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)


@dataclass
class LodoResult:
    """Leave-one-source-out AUROC per candidate setting and held-out source, and the chosen setting."""

    table: pl.DataFrame  # candidate, held_out, n, n_positive, auroc, auroc_ci_low, auroc_ci_high
    chosen: FinetuneSettings
    chosen_index: int

    def worst(self, candidate: int | None = None) -> float:
        rows = self.table.filter(pl.col("candidate") == (self.chosen_index if candidate is None else candidate))
        return float(rows["auroc"].min())  # type: ignore[arg-type]


Trainer = Callable[[list[str], np.ndarray, FinetuneSettings], InjectionDetector]


def finetune_trainer(encoder: EncoderRef | None = None, *, progress: bool = False) -> Trainer:
    """Trains the D4 architecture; frozen features are computed once per text and setting across folds."""
    from rvu_pipelines.detectors.finetune import finetune

    caches: dict[tuple[int, int], dict[str, Any]] = {}

    def train(texts: list[str], labels: np.ndarray, settings: FinetuneSettings) -> InjectionDetector:
        cache = caches.setdefault((settings.trainable_layers, settings.max_length), {})
        detector, _ = finetune(
            texts, labels, encoder=encoder, settings=settings, progress=progress, feature_cache=cache
        )
        return detector

    return train


def select_settings(
    examples: pl.DataFrame,
    documents: pl.DataFrame,
    trainer: Trainer,
    *,
    candidates: Sequence[FinetuneSettings] = CANDIDATES,
    sources: Sequence[str] = LODO_SOURCES,
    n_resamples: int = 1000,
    progress: Callable[[str], None] | None = None,
) -> LodoResult:
    """Leave one source out: train on the other sources (hard negatives always in), AUROC on the held-out
    source's documents (``documents``: every split of every source, see :func:`evaluation_documents`). The
    candidate with the best worst-source AUROC (then the best mean) is chosen."""
    say = progress or (lambda _m: None)
    rows = []
    for index, candidate in enumerate(candidates):
        for held_out in sources:
            train = examples.filter(pl.col("source") != held_out)
            test = documents.filter(pl.col("source") == held_out)
            y = test["label"].to_numpy().astype(np.int64)
            if len(set(y.tolist())) < 2:
                raise DetectorError(f"Held-out source {held_out!r} has test documents of one label only.")
            detector = trainer(train["text"].to_list(), train["label"].to_numpy().astype(np.int64), candidate)
            scores = detector.score(test["text"].to_list())
            low, high = bootstrap_auroc(y, scores, n_resamples)
            rows.append(
                {
                    "candidate": index,
                    "trainable_layers": candidate.trainable_layers,
                    "epochs": candidate.epochs,
                    "held_out": held_out,
                    "n_train": train.height,
                    "n": int(y.size),
                    "n_positive": int(y.sum()),
                    "auroc": _auroc(y, scores),
                    "auroc_ci_low": low,
                    "auroc_ci_high": high,
                }
            )
            say(
                f"candidate {index} ({candidate.trainable_layers} layers), {held_out} held out: "
                f"AUROC {rows[-1]['auroc']:.3f}"
            )
    table = pl.DataFrame(rows)
    summary = table.group_by("candidate").agg(worst=pl.col("auroc").min(), mean=pl.col("auroc").mean())
    best = summary.sort(["worst", "mean", "candidate"], descending=[True, True, False]).row(0, named=True)
    chosen = int(best["candidate"])
    return LodoResult(table, candidates[chosen], chosen)


THRESHOLD_MARGIN = 1e-6  # above float32 noise: the served graph re-computes scores that were calibrated in float64


def threshold_for_fpr(benign_scores: np.ndarray, target_fpr: float) -> float:
    """A threshold at which at most ``floor(target_fpr * n)`` benign scores are >= it, THRESHOLD_MARGIN above the
    first benign score it must not flag, so re-computing that score in float32 cannot push it over."""
    scores = np.sort(np.asarray(benign_scores, dtype=np.float64))[::-1]
    if scores.size == 0:
        raise DetectorError("Calibration needs benign scores; the calibration split is empty.")
    allowed = int(math.floor(target_fpr * scores.size))
    if allowed >= scores.size:
        return 0.0
    return float(scores[allowed] + THRESHOLD_MARGIN)


def logit(p: float) -> float:
    p = min(max(p, 1e-12), 1.0 - 1e-12)
    return math.log(p / (1.0 - p))


@dataclass(frozen=True)
class Calibration:
    """The operating threshold on the raw score and the logit offset that moves it to 0.5."""

    threshold: float
    logit_offset: float
    n_benign: int
    target_fpr: float
    calibration_fpr: float

    def record(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def calibrate(detector: InjectionDetector, benign_texts: Sequence[str], target_fpr: float = TARGET_FPR) -> Calibration:
    """Threshold for FPR <= ``target_fpr`` on the deployment's benign calibration outputs (scored as documents)."""
    scores = detector.score(list(benign_texts))
    threshold = threshold_for_fpr(scores, target_fpr)
    fpr = float(np.mean(scores >= threshold))
    return Calibration(threshold, logit(threshold), int(scores.size), target_fpr, fpr)


def calibrated(detector: Any, calibration: Calibration) -> Any:
    """The same model with the calibration folded in (0.5 = the calibrated threshold), named as production."""
    moved = detector.with_logit_offset(detector.settings.logit_offset + calibration.logit_offset)
    moved.name = f"{PRODUCTION_NAME} ({getattr(detector, 'variant', 'float')})"
    return moved


@dataclass
class ProductionDetector:
    """The trained float model (uncalibrated), its calibration and what it was built from."""

    detector: FinetunedDetector
    settings: RecipeSettings
    calibration: Calibration
    calibration_texts: list[str] = field(repr=False)
    n_train: dict[str, int]
    lodo: LodoResult | None = None

    @property
    def reference(self) -> FinetunedDetector:
        """The float PyTorch model with its calibration: the reference the served int8 graph is compared with."""
        return calibrated(self.detector, self.calibration)  # type: ignore[no-any-return]

    def metrics(self) -> dict[str, float]:
        out = {f"n_train_{k}": float(v) for k, v in self.n_train.items()}
        out.update({f"calibration_{k}": v for k, v in self.calibration.record().items()})
        if self.lodo is not None:
            for row in self.lodo.table.filter(pl.col("candidate") == self.lodo.chosen_index).iter_rows(named=True):
                out[f"lodo_auroc_{row['held_out']}"] = float(row["auroc"])
            out["lodo_auroc_worst"] = self.lodo.worst()
        return out


def calibration_outputs(deployment: Any, settings: RecipeSettings) -> list[str]:
    """The benign tool outputs of the calib split the threshold is set on, by id; a seeded sample of
    ``settings.calibration_outputs`` of them when that is set."""
    frame = deployment.benign.filter(pl.col("split") == "calib").sort("id")
    if settings.calibration_outputs is not None and settings.calibration_outputs < frame.height:
        frame = frame.sample(settings.calibration_outputs, seed=settings.seed).sort("id")
    return [str(text) for text in frame["text"]]


def train_production(
    corpora: Mapping[str, Corpus],
    deployment: Any,
    hard_negatives: pl.DataFrame,
    *,
    settings: RecipeSettings | None = None,
    encoder: EncoderRef | None = None,
    lodo: LodoResult | None = None,
    progress: bool = False,
) -> ProductionDetector:
    """Train on every training example with the chosen setting (``lodo.chosen`` when given), then calibrate."""
    from rvu_pipelines.detectors.finetune import encoder_tokenizer, finetune, resolve_encoder

    settings = settings or RecipeSettings()
    if lodo is not None:
        settings = replace(settings, finetune=lodo.chosen)
    base = encoder or resolve_encoder()
    examples = training_examples(corpora, deployment, hard_negatives, encoder_tokenizer(base), settings)
    detector, _ = finetune(
        examples["text"].to_list(),
        examples["label"].to_numpy().astype(np.int64),
        encoder=base,
        settings=settings.finetune,
        progress=progress,
    )
    texts = calibration_outputs(deployment, settings)
    calibration = calibrate(detector, texts, settings.target_fpr)
    counts = examples.group_by("source", "label").len().sort("source", "label")
    n_train = {f"{r['source']}_{r['label']}": int(r["len"]) for r in counts.iter_rows(named=True)}
    return ProductionDetector(detector, settings, calibration, texts, n_train, lodo)


@dataclass(frozen=True)
class ServedDetector:
    """The exported int8 graph, calibrated on its own scores (the runtime users run), and its folder."""

    detector: Any  # OnnxDetector
    calibration: Calibration
    folder: Path


def export_production(production: ProductionDetector, folder: Path) -> ServedDetector:
    """Export to ONNX, calibrate the int8 graph on the same benign outputs, record its offset beside the graphs."""
    import json

    from rvu_pipelines.atomic_write import write_atomically
    from rvu_pipelines.detectors.onnx_d4 import ONNX_CONFIG, OnnxDetector, export_detector

    export_detector(production.detector, folder)
    raw = OnnxDetector.load(folder, "int8", encoder=production.detector.encoder)
    calibration = calibrate(raw, production.calibration_texts, production.settings.target_fpr)
    record = json.loads((folder / ONNX_CONFIG).read_text())
    record["settings"]["logit_offset"] = float(raw.settings.logit_offset + calibration.logit_offset)
    record["calibration"] = calibration.record()
    write_atomically(folder / ONNX_CONFIG, json.dumps(record, indent=1, sort_keys=True).encode())
    served = OnnxDetector.load(folder, "int8", encoder=production.detector.encoder)
    served.name = PRODUCTION_NAME
    return ServedDetector(served, calibration, folder)


def register_production(
    production: ProductionDetector,
    served: ServedDetector,
    *,
    run_id: str,
    tracking_uri: str | None = None,
) -> dict[str, object]:
    """Register the int8 graph as ``rvu-injection-detector@production`` and the float model as ``@reference``."""
    from rvu_pipelines.detectors.registry import register_detector

    tags = {
        "operating_threshold": served.calibration.threshold,
        "logit_offset": served.calibration.logit_offset,
        "target_fpr": served.calibration.target_fpr,
        "calibration_n": served.calibration.n_benign,
        "trainable_layers": production.settings.finetune.trainable_layers,
    }
    description = (
        "Prompt-injection detector trained on every corpus in the data mirror plus the deployment's benign tool "
        "outputs and hard negatives; scores are calibrated so 0.5 flags at most 1 % of benign tool outputs."
    )
    registered = {
        role: register_detector(
            model,
            name=PRODUCTION_NAME,
            run_id=run_id,
            tracking_uri=tracking_uri,
            tags=tags,
            description=description,
            alias=alias,
        )
        for role, model, alias in (
            ("reference", production.reference, REFERENCE_ALIAS),
            ("production", served.detector, PRODUCTION_ALIAS),
        )
    }
    out: dict[str, object] = {role: ref.record() for role, ref in registered.items()}
    return out | tags


@detector_plugin(
    PRODUCTION_CHOICE,
    summary=f"{PRODUCTION_NAME} at alias '{PRODUCTION_ALIAS}' in the MLflow registry: the calibrated detector "
    "(0.5 = 1 % FPR on benign tool outputs)",
)
def _load_production(argument: str, tracking_uri: str | None) -> tuple[InjectionDetector, str]:
    from rvu_pipelines.detectors.registry import load_registered_detector
    from rvu_pipelines.errors import RegisteredDetectorError

    try:
        detector = load_registered_detector(PRODUCTION_NAME, tracking_uri, alias=PRODUCTION_ALIAS)
    except RegisteredDetectorError as exc:
        raise RegisteredDetectorError(
            f"{exc} The production detector is trained and registered by the asset 'detector_production' "
            "(part of `make run`'s default job); materialize it, or choose another detector "
            "(nanoguard, heuristic)."
        ) from exc
    ref = detector.registered  # type: ignore[attr-defined]
    return detector, f"registered:{ref.name}@{PRODUCTION_ALIAS}={ref.version}"
