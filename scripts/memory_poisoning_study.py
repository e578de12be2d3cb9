"""Run the memory-poisoning study (seed 003) outside Dagster and print the paper's table beside ours.

    .venv/bin/python scripts/memory_poisoning_study.py               # the full study, |M| = 1,000
    .venv/bin/python scripts/memory_poisoning_study.py --sampled     # the default job's sample

The same library call as the ``memory_poisoning_study`` / ``memory_poisoning_sample`` assets; outputs
(matrix.parquet, paper_table.md, write_time.md, retrieval.md, retro_scan.md / .parquet / .png and the incident
the retro-scan opens, roc.png, memsad_scores.png, sir.png, summary.json) go to
``--out``. Data come from the mirror (RVU_DATA_MIRROR, ../shared/data by default) or the public sources.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from rvu_pipelines.data.catalog import load_catalog, load_dataset
from rvu_pipelines.data.sources import default_dataset_source
from rvu_pipelines.memory_poisoning.runner import run_study
from rvu_pipelines.memory_poisoning.sir import SIRConfig
from rvu_pipelines.memory_poisoning.study_cells import StudyConfig
from rvu_pipelines.memory_poisoning.timeline import ScanConfig
from rvu_pipelines.models import ModelStore, load_model_config
from rvu_pipelines.models.embedder import SentenceEmbedder
from rvu_pipelines.paths import state_dir

DATASETS = ("agentpoison_strategyqa", "minja", "injecagent")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampled", action="store_true", help="the default job's sampled study")
    parser.add_argument("--regime", choices=("small", "medium", "full"), help="override the memory regime")
    parser.add_argument("--out", type=Path, help="output folder (default .rvu/memory_poisoning/<study|sample>)")
    parser.add_argument("--no-llm", action="store_true", help="hybrid check without the perplexity feature")
    parser.add_argument("--adaptive-poisons", type=int, help="poisons each adaptive attack rewrites (default: all)")
    args = parser.parse_args()
    if args.sampled:
        config, sir, name = StudyConfig.sampled(), SIRConfig(agents=6, steps=10, seeds=(0, 1)), "sample"
        scan = ScanConfig(seeds=(0, 1, 2))
    else:
        config, sir, name = StudyConfig(agentpoison_poisons=20, agentpoison_train=20), SIRConfig(), "study"
        scan = ScanConfig()
    if args.regime:
        config = replace(config, regime=args.regime)
    if args.adaptive_poisons:
        config = replace(config, adaptive_poisons=args.adaptive_poisons)
    out = args.out or state_dir() / "memory_poisoning" / name
    catalog, source = load_catalog(), default_dataset_source()
    frames = {n: load_dataset(catalog.datasets[n], source).frame for n in DATASETS}
    profile, store = load_model_config().profile("tiny"), ModelStore()
    embedder = SentenceEmbedder(store.resolve("embedder", profile["embedder"]).path)
    llm = None if args.no_llm else store.resolve("llm", profile["llm"]).path
    start = time.perf_counter()
    result = run_study(
        frames, embedder, config, out, llm_path=llm, sir=sir, scan=scan, progress=lambda m: print(m, flush=True)
    )
    for table in ("paper_table.md", "write_time.md", "retro_scan.md", "retrieval.md"):
        print(f"\n{(out / table).read_text()}")
    print("hybrid kappa (benign data only):", result.hybrid_kappa)
    print("protocol:", result.protocol)
    for a in result.adaptive:
        print("adaptive:", a.as_dict())
    for c in result.sir:
        print("SIR:", c.defense, c.summary())
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in result.timings.items())
    print(f"wall time {time.perf_counter() - start:.0f} s; stages {stages}")
    print(f"outputs in {out}")


if __name__ == "__main__":
    main()
