"""Run the memory-poisoning matrix over several splits and seeds at |M| = 1,000 and full: mean ± sd.

    .venv/bin/python scripts/memory_poisoning_seeds.py                       # seeds 0-4, medium and full
    .venv/bin/python scripts/memory_poisoning_seeds.py --seeds 0 1 --regimes small --sampled   # a quick look

The same library call as the ``memory_poisoning_seeds`` asset. Outputs (seeds.parquet with every draw's matrix
rows, seeds_summary.parquet, seeds.md, seeds_comparisons.md / .parquet, seeds.png) go to ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rvu_pipelines.data.catalog import load_catalog, load_dataset
from rvu_pipelines.data.sources import default_dataset_source
from rvu_pipelines.memory_poisoning.seeds import SWEEP_REGIMES, SWEEP_SEEDS, SweepConfig, seed_sweep, write_sweep
from rvu_pipelines.memory_poisoning.study_cells import StudyConfig
from rvu_pipelines.models import ModelStore, load_model_config
from rvu_pipelines.models.embedder import SentenceEmbedder
from rvu_pipelines.paths import state_dir

DATASETS = ("agentpoison_strategyqa", "minja", "injecagent")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SWEEP_SEEDS), help="one draw per seed")
    parser.add_argument("--regimes", nargs="+", default=list(SWEEP_REGIMES), choices=("small", "medium", "full"))
    parser.add_argument(
        "--sampled", action="store_true", help="the default job's short trigger search and 2 MINJA victims"
    )
    parser.add_argument("--out", type=Path, help="output folder (default .rvu/memory_poisoning/seeds)")
    parser.add_argument(
        "--llm",
        action="store_true",
        help="the hybrid's LLM-perplexity feature (off, as in the study asset: minutes per fit)",
    )
    args = parser.parse_args()
    base = StudyConfig.sampled() if args.sampled else StudyConfig(agentpoison_poisons=20, agentpoison_train=20)
    config = SweepConfig(seeds=tuple(args.seeds), regimes=tuple(args.regimes), base=base)
    out = args.out or state_dir() / "memory_poisoning" / "seeds"
    catalog, source = load_catalog(), default_dataset_source()
    frames = {n: load_dataset(catalog.datasets[n], source).frame for n in DATASETS}
    profile, store = load_model_config().profile("tiny"), ModelStore()
    embedder = SentenceEmbedder(store.resolve("embedder", profile["embedder"]).path)
    llm = None if not args.llm else store.resolve("llm", profile["llm"]).path
    start = time.perf_counter()
    result = seed_sweep(frames, embedder, config, llm_path=llm, progress=lambda m: print(m, flush=True))
    files = write_sweep(result, out)
    for name in ("seeds_md", "comparisons_md"):
        print(f"\n{files[name].read_text()}")
    print(f"wall time {time.perf_counter() - start:.0f} s; outputs in {out}")


if __name__ == "__main__":
    main()
