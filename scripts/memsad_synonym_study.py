"""The synonym loophole as the seed ran it: n poisons (60 by default), greedy WordNet substitution against MEMSAD
with no budget and only what the attack needs kept verbatim, the ASR-R change measured by retrieval; beside it
the stricter attacker that keeps every retrieving victim, and the hybrid check with and without the trigger in
the served queries.

    RVU_DATA_MIRROR=../shared/data .venv/bin/python scripts/memsad_synonym_study.py   # make memsad-synonym

Threat model: the attacker has write access, the white-box encoder and MEMSAD's score (the seed's adaptive
adversary); MEMSAD is calibrated against the seed's history of triggered victim queries, the one setting in
which it flags the unmodified poisons. Outputs (synonym_study.md, synonym_study.json) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rvu_pipelines.data.catalog import load_catalog, load_dataset
from rvu_pipelines.data.sources import default_dataset_source
from rvu_pipelines.machine import results_stamp, stamp_line
from rvu_pipelines.memory_poisoning.runner import benign_hybrid_kappa, hybrid_factory
from rvu_pipelines.memory_poisoning.study_adaptive import adaptive_study
from rvu_pipelines.memory_poisoning.study_cells import EmbeddingCache, StudyConfig, build_cell
from rvu_pipelines.models import ModelStore, load_model_config
from rvu_pipelines.models.embedder import SentenceEmbedder
from rvu_pipelines.paths import state_dir

KEYS = ("n_poisons", "asr_r_before", "asr_r_after", "delta_asr_r", "detected_before", "detected_after")
HYBRID = ("tpr", "tpr_low", "tpr_high", "fpr", "n_benign")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poisons", type=int, default=60, help="AgentPoison poisons (and training questions)")
    parser.add_argument("--regime", choices=("small", "medium", "full"), default="medium")
    parser.add_argument("--methods", default="synonym,synonym_retrieval_kept")
    parser.add_argument("--out", type=Path, default=state_dir() / "memory_poisoning" / "synonym")
    args = parser.parse_args()
    config = StudyConfig(regime=args.regime, agentpoison_poisons=args.poisons, agentpoison_train=args.poisons)
    catalog, source = load_catalog(), default_dataset_source()
    frames = {"agentpoison_strategyqa": load_dataset(catalog.datasets["agentpoison_strategyqa"], source).frame}
    profile, store = load_model_config().profile("tiny"), ModelStore()
    embedder = SentenceEmbedder(store.resolve("embedder", profile["embedder"]).path)
    stamp = results_stamp("scripts/memsad_synonym_study.py " + " ".join(sys.argv[1:]))
    start = time.perf_counter()
    cell = build_cell("agentpoison", frames, EmbeddingCache(embedder), config)
    kappa = benign_hybrid_kappa(cell, None)
    results = adaptive_study(
        cell,
        embedder,
        hybrid_factory(None, kappa.kappa),
        kappa=config.kappa,
        top_k=config.top_k,
        methods=tuple(args.methods.split(",")),
        progress=lambda m: print(m, flush=True),
    )
    lines = [
        f"Synonym study: {len(cell.attack.poisons)} AgentPoison poisons, |M| = {len(cell.memory)}, MEMSAD kappa "
        f"{config.kappa:g} on the triggered history; hybrid kappa {kappa.kappa:g} from benign data "
        f"(5-fold FPR {kappa.cv_fpr:.3f}); {time.perf_counter() - start:.0f} s. {stamp_line(stamp)}",
        "",
        "| attack | n | ASR-R before -> after | MEMSAD flags before -> after | hybrid TPR [95% CI] / FPR "
        "(triggered history) | hybrid TPR [95% CI] / FPR (plain history) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        s, h, p = r.summary, r.hybrid, r.hybrid_plain
        lines.append(
            f"| {r.method} | {s.n_poisons} | {s.asr_r_before:.2f} -> {s.asr_r_after:.2f} | {s.detected_before} -> "
            f"{s.detected_after} | {h['tpr']:.2f} [{h['tpr_low']:.2f}, {h['tpr_high']:.2f}] / {h['fpr']:.3f} | "
            f"{p['tpr']:.2f} [{p['tpr_low']:.2f}, {p['tpr_high']:.2f}] / {p['fpr']:.3f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "synonym_study.md").write_text("\n".join(lines) + "\n")
    payload = {"stamp": stamp, "hybrid_kappa": kappa.as_dict(), "results": [r.as_dict() for r in results]}
    (args.out / "synonym_study.json").write_text(json.dumps(payload, indent=1, sort_keys=True, default=str))
    print("\n".join(lines))
    print(f"outputs in {args.out}")


if __name__ == "__main__":
    main()
