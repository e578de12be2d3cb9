"""The detector validity table: D1-D5, the production detector and a length control, measured off their training
distribution (held-out sources, over-defense, benign tool outputs, buried injections, non-English, latency).

Threat model and timeline: the detector screens a text before the agent reads it; the attacker writes the
injection and picks where it sits in a long tool output. Every detector decides with what it had at training
time: D2/D4/D5 saw deepset's training split; the production detector saw every corpus's training split, the
deployment's benign training outputs and trigger-word documentation sentences, and chose its setting by
leave-one-source-out on training data and its threshold on the calibration split. Nothing evaluated here
(test splits, the over-defense set's test sources, buried documents) was seen by any of them.

The ``detector_validity`` asset runs it (``make detector-validity``) and writes ``detector_validity.md`` (stamped)
and ``detector_validity.json``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.detectors import (
    HeuristicDetector,
    TfidfDetector,
    finetune,
    load_corpora,
    load_pretrained_detector,
    seed_ensemble,
    settings_for,
)
from rvu_pipelines.detectors.base import MemoizedDetector
from rvu_pipelines.detectors.buried import build_buried_set, cut_to_tokens
from rvu_pipelines.detectors.deployment_texts import load_deployment_texts
from rvu_pipelines.detectors.finetune import FinetuneSettings, encoder_tokenizer, resolve_encoder
from rvu_pipelines.detectors.overdefense import build_overdefense_set
from rvu_pipelines.detectors.production import (
    CANDIDATES,
    RecipeSettings,
    evaluation_documents,
    export_production,
    finetune_trainer,
    select_settings,
    train_production,
    training_examples,
)
from rvu_pipelines.detectors.validity import (
    DetectorSpec,
    LengthControl,
    ValidityData,
    evaluate_validity,
    language_table,
    validity_markdown,
)
from rvu_pipelines.machine import results_stamp, stamp_line

BURIED_PAIRS = {512: 40, 2048: 40, 8192: 10}  # buried injection pairs per document length (tokens)


@dataclass(frozen=True)
class ValidityOptions:
    """``quick``: small samples and one epoch, a smoke run and not results; ``pairs``: buried pairs per length;
    ``max_per_class``: production training examples per source and label; ``lodo_documents``: held-out documents
    per source and label in the production detector's leave-one-source-out selection."""

    quick: bool = False
    pairs: Mapping[int, int] = field(default_factory=lambda: dict(BURIED_PAIRS))
    max_per_class: int = 300
    lodo_documents: int = 150

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.pairs.items() if k < 1 or v < 1}
        if bad or not self.pairs:
            raise ValueError(f"pairs {dict(self.pairs)}: every length and count must be positive, at least one")
        if self.max_per_class < 1 or self.lodo_documents < 1:
            raise ValueError("max_per_class and lodo_documents must be positive")


@dataclass(frozen=True)
class ValidityReport:
    table: pl.DataFrame  # one row per detector: every column with its n and CI
    markdown: str


def run_validity(
    options: ValidityOptions, out: Path, *, command: str, say: Callable[[str], None] = print
) -> ValidityReport:
    """Train what is measured, measure it, write ``detector_validity.md`` / ``.json`` into ``out``."""
    started = time.perf_counter()
    pairs = {512: 6, 2048: 6} if options.quick else dict(options.pairs)
    d4_overrides = {"epochs": 1, "max_length": 64} if options.quick else {}

    say("loading corpora, deployment texts and the over-defense set")
    corpora = load_corpora(["deepset", "jailbreak"])
    deployment = load_deployment_texts()
    overdefense = build_overdefense_set().frame
    encoder = resolve_encoder("tiny" if options.quick else None)
    tokenizer = encoder_tokenizer(encoder)
    documents = evaluation_documents(corpora, deployment)
    if options.quick:
        documents = documents.group_by("source", "label", maintain_order=True).head(12)

    say("training D2 and D4 on deepset's training split")
    deepset = corpora["deepset"]
    d2 = TfidfDetector.train(deepset.texts("train"), deepset.labels("train"))
    d4, _ = finetune(
        deepset.texts("train"),
        deepset.labels("train"),
        encoder=encoder,
        settings=settings_for("deepset", **d4_overrides),
        progress=False,
    )
    d3 = load_pretrained_detector("nanoguard").detector

    say("production detector: leave-one-source-out selection")
    recipe = RecipeSettings(max_per_class=40 if options.quick else options.max_per_class)
    candidates = [FinetuneSettings(**{**c.__dict__, **d4_overrides}) for c in CANDIDATES]
    examples = training_examples(corpora, deployment, overdefense, tokenizer, recipe)
    lodo_documents = evaluation_documents(corpora, deployment, ("train", "calib", "test"))
    per_cell = 12 if options.quick else options.lodo_documents  # a seeded sample per source and label
    lodo_documents = pl.concat(
        part.sample(min(per_cell, part.height), seed=42)
        for part in lodo_documents.partition_by("source", "label", maintain_order=True)
    ).sort("source", "split", "id")
    lodo = select_settings(
        examples,
        lodo_documents,
        finetune_trainer(encoder),
        candidates=candidates,
        n_resamples=100 if options.quick else 1000,
        progress=say,
    )
    say(f"chosen: {lodo.chosen.trainable_layers} trainable layers (worst held-out AUROC {lodo.worst():.3f})")
    production = train_production(corpora, deployment, overdefense, settings=recipe, encoder=encoder, lodo=lodo)
    with tempfile.TemporaryDirectory(prefix="rvu-production-") as folder:
        served = export_production(production, Path(folder) / "onnx")
        say(f"calibrated: threshold {served.calibration.threshold:.4f} on {served.calibration.n_benign} benign outputs")

        test_overdefense = overdefense.filter(pl.col("split") == "test")
        benign_test = deployment.benign.filter(pl.col("split") == "test").sort("id")["text"].to_list()
        payloads = deployment.payloads.filter(pl.col("split") == "test").sort("id")
        payload_pairs = list(zip(payloads["id"].to_list(), payloads["text"].to_list(), strict=True))
        injections = deepset.part("test").filter(pl.col("label") == 1)
        payload_pairs += list(zip(injections["id"].to_list(), injections["text"].to_list(), strict=True))
        buried = build_buried_set(tokenizer, benign_test, payload_pairs, lengths=sorted(pairs), pairs_per_length=pairs)
        long_benign = [t for t in benign_test if len(tokenizer(t)["input_ids"]) >= 512] or benign_test
        latency_texts = [cut_to_tokens(tokenizer, (t + "\n\n") * 8, 512) for t in long_benign[:32]]
        data = ValidityData(deepset.part("test"), documents, test_overdefense, buried, latency_texts)

        production_docs = documents  # its in-distribution set: every source's test documents
        chosen = lodo.table.filter(pl.col("candidate") == lodo.chosen_index)
        seen = frozenset({"deepset"})
        m2, m4 = MemoizedDetector(d2), MemoizedDetector(d4)  # D5 reuses their scores; latency is timed uncached
        specs = [
            DetectorSpec("D1 heuristic", HeuristicDetector(), frozenset()),
            DetectorSpec("D2 TF-IDF (deepset)", m2, seen, timed=d2),
            DetectorSpec(
                "D3 NanoGuard (zero-shot)", d3, seen
            ),  # its training sets are not published: deepset may be in
            DetectorSpec("D4 MiniLM (deepset)", m4, seen, timed=d4),
            DetectorSpec("D5 ensemble (deepset)", seed_ensemble(m2, m4), seen, timed=seed_ensemble(d2, d4)),
            DetectorSpec("production (ONNX int8)", served.detector, frozenset(), production_docs, chosen),
            DetectorSpec(
                "production, mean over windows", served.detector.with_aggregate("mean"), frozenset(), production_docs
            ),
            DetectorSpec("control: length", LengthControl(lambda t: len(t.split())), frozenset()),
        ]
        table = evaluate_validity(specs, data, n_resamples=100 if options.quick else 1000, log=say)
        languages = language_table({s.key: s.detector for s in specs[:6]}, deepset.part("test"))  # D1-D5, production

        stamp = results_stamp(command)
        stamp["wall"] = f"{(time.perf_counter() - started) / 60:.1f} min"
        lodo_md = "| setting | held out | n | AUROC [95 % CI] |\n|---|---|---|---|\n" + "\n".join(
            f"| {r['trainable_layers']} layers | {r['held_out']} | {r['n']} | {r['auroc']:.3f} "
            f"[{r['auroc_ci_low']:.3f}, {r['auroc_ci_high']:.3f}] |"
            for r in lodo.table.iter_rows(named=True)
        )
        lang_md = (
            "| detector | language | n (injections) | AUROC [95 % CI] | F1 @ 0.5 |\n|---|---|---|---|---|\n"
            + "\n".join(
                f"| {r['detector']} | {r['language']} | {r['n']} ({r['n_positive']}) | {r['auroc']:.3f} "
                f"[{r['auroc_ci_low']:.3f}, {r['auroc_ci_high']:.3f}] | {r['f1'] * 100:.1f} |"
                for r in languages.iter_rows(named=True)
            )
        )
        counts = examples.group_by("source", "label").len().sort("source", "label")
        train_md = ", ".join(f"{r['source']}/{r['label']}: {r['len']}" for r in counts.iter_rows(named=True))
        report = "\n\n".join(
            [
                "# Detector validity",
                f"{stamp_line(stamp)} Wall time {stamp['wall']}.",
                "## Detectors\n\n" + validity_markdown(table),
                "## Production detector: leave-one-source-out selection (chosen: "
                f"{lodo.chosen.trainable_layers} trainable layers)\n\n{lodo_md}",
                f"Training examples per source/label: {train_md}. Calibration: threshold "
                f"{served.calibration.threshold:.4f} (raw score) on {served.calibration.n_benign} benign tool outputs, "
                f"FPR there {served.calibration.calibration_fpr * 100:.1f} %.",
                "## deepset test split by language (the encoder is English-only)\n\n" + lang_md,
            ]
        )
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "detector_validity.md", report + "\n")
    write_atomically(out / "detector_validity.json", table.write_json())
    return ValidityReport(table, report)
