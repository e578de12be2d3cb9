"""The detector validity table: D1-D5, the production detector and a length control, measured off their training
distribution (held-out sources, over-defense, benign tool outputs, buried injections, non-English, latency).

Threat model and timeline: the detector screens a text before the agent reads it; the attacker writes the
injection and picks where it sits in a long tool output. Every detector decides with what it had at training
time: D2/D4/D5 saw deepset's training split; the production detector saw every corpus's training split, the
deployment's benign training outputs and trigger-word documentation sentences, and chose its setting by
leave-one-source-out on training data and its threshold on the calibration split. Nothing evaluated here
(test splits, the over-defense set's test sources, buried documents) was seen by any of them.

    RVU_DATA_MIRROR=../shared/data .venv/bin/python scripts/detector_validity.py [--quick] [--out DIR]

``make detector-validity`` runs it. Each detector's row is logged as one MLflow run (experiment
``rvu-detector-validity``) so runs compare; the markdown goes to stdout and, with ``--out``, to a file stamped
with the command, commit, date and machine.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from rvu_pipelines.code_version import code_version
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
from rvu_pipelines.machine import machine_line

EXPERIMENT = "rvu-detector-validity"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_pairs(value: str) -> dict[int, int]:
    out = {}
    for part in value.split(","):
        length, _, n = part.partition("=")
        out[int(length)] = int(n)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small samples and one epoch: a smoke run, not results")
    parser.add_argument("--pairs", default="512=40,2048=40,8192=10", help="buried pairs per length")
    parser.add_argument("--max-per-class", type=int, default=300, help="production training examples per source/label")
    parser.add_argument(
        "--lodo-documents", type=int, default=150, help="held-out documents per source and label in the selection"
    )
    parser.add_argument("--no-mlflow", action="store_true", help="do not log the rows to MLflow")
    parser.add_argument("--out", type=Path, help="folder for detector_validity.md")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    pairs = {512: 6, 2048: 6} if args.quick else parse_pairs(args.pairs)
    d4_overrides = {"epochs": 1, "max_length": 64} if args.quick else {}

    say("loading corpora, deployment texts and the over-defense set")
    corpora = load_corpora(["deepset", "jailbreak"])
    deployment = load_deployment_texts()
    overdefense = build_overdefense_set().frame
    encoder = resolve_encoder("tiny" if args.quick else None)
    tokenizer = encoder_tokenizer(encoder)
    documents = evaluation_documents(corpora, deployment)
    if args.quick:
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
    recipe = RecipeSettings(max_per_class=40 if args.quick else args.max_per_class)
    candidates = [FinetuneSettings(**{**c.__dict__, **d4_overrides}) for c in CANDIDATES]
    examples = training_examples(corpora, deployment, overdefense, tokenizer, recipe)
    lodo_documents = evaluation_documents(corpora, deployment, ("train", "calib", "test"))
    per_cell = 12 if args.quick else args.lodo_documents  # a seeded sample per source and label
    lodo_documents = pl.concat(
        part.sample(min(per_cell, part.height), seed=42)
        for part in lodo_documents.partition_by("source", "label", maintain_order=True)
    ).sort("source", "split", "id")
    lodo = select_settings(
        examples,
        lodo_documents,
        finetune_trainer(encoder),
        candidates=candidates,
        n_resamples=100 if args.quick else 1000,
        progress=say,
    )
    say(f"chosen: {lodo.chosen.trainable_layers} trainable layers (worst held-out AUROC {lodo.worst():.3f})")
    production = train_production(corpora, deployment, overdefense, settings=recipe, encoder=encoder, lodo=lodo)
    folder = Path(tempfile.mkdtemp(prefix="rvu-production-"))
    served = export_production(production, folder / "onnx")
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
        DetectorSpec("D3 NanoGuard (zero-shot)", d3, seen),  # its training sets are not published: deepset may be in
        DetectorSpec("D4 MiniLM (deepset)", m4, seen, timed=d4),
        DetectorSpec("D5 ensemble (deepset)", seed_ensemble(m2, m4), seen, timed=seed_ensemble(d2, d4)),
        DetectorSpec("production (ONNX int8)", served.detector, frozenset(), production_docs, chosen),
        DetectorSpec(
            "production, mean over windows", served.detector.with_aggregate("mean"), frozenset(), production_docs
        ),
        DetectorSpec("control: length", LengthControl(lambda t: len(t.split())), frozenset()),
    ]
    table = evaluate_validity(specs, data, n_resamples=100 if args.quick else 1000, log=say)
    languages = language_table({s.key: s.detector for s in specs[:6]}, deepset.part("test"))  # D1-D5, production

    command = "RVU_DATA_MIRROR=../shared/data .venv/bin/python scripts/detector_validity.py " + shlex.join(argv)
    stamp = (
        f"command: `{command.strip()}`; commit {code_version()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
        f"machine: {machine_line()}; wall {(time.perf_counter() - started) / 60:.1f} min"
    )
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
            stamp,
            "## Detectors\n\n" + validity_markdown(table),
            "## Production detector: leave-one-source-out selection (chosen: "
            f"{lodo.chosen.trainable_layers} trainable layers)\n\n{lodo_md}",
            f"Training examples per source/label: {train_md}. Calibration: threshold "
            f"{served.calibration.threshold:.4f} (raw score) on {served.calibration.n_benign} benign tool outputs, "
            f"FPR there {served.calibration.calibration_fpr * 100:.1f} %.",
            "## deepset test split by language (the encoder is English-only)\n\n" + lang_md,
        ]
    )
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "detector_validity.md").write_text(report + "\n")
        table.write_json(args.out / "detector_validity.json")
    if not args.no_mlflow:
        from rvu_pipelines.tracking import MlflowTracker

        tracker = MlflowTracker(None, EXPERIMENT)
        for row in table.iter_rows(named=True):
            metrics = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and np.isfinite(v)}
            with tracker.run(
                name=str(row["detector"]), params={"detector": row["detector"], "quick": args.quick}
            ) as run:
                run.log_metrics(metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
