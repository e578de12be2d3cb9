"""MINJA through the real agent on llama.cpp: ISR, ASR-R and ASR-A beside a no-attack control and MEMSAD as the
memory monitor's write check.

    .venv/bin/python scripts/minja_agent.py                          # camera, 10 attacker queries, 20 victims
    .venv/bin/python scripts/minja_agent.py --victim chair --victims 40

Outputs (minja_agent.md, minja_agent_episodes.parquet with every episode, summary.json) go to ``--out``
(default .rvu/memory_poisoning/agent). Data from the mirror (RVU_DATA_MIRROR) or the public sources.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

from rvu_pipelines.data.catalog import load_catalog, load_dataset
from rvu_pipelines.data.sources import default_dataset_source
from rvu_pipelines.memory_poisoning.agent_loop import AgentConfig, minja_agent_study, plan_minja, write_agent_outputs
from rvu_pipelines.memory_poisoning.attacks.minja import indication_templates
from rvu_pipelines.memory_poisoning.corpus import minja_victims
from rvu_pipelines.models import ModelStore, load_model_config
from rvu_pipelines.models.embedder import SentenceEmbedder
from rvu_pipelines.models.llm import LlamaCppChatModel
from rvu_pipelines.paths import state_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--victim", default="camera", help="the MINJA victim setting")
    parser.add_argument("--attack", type=int, default=10, help="attacker queries")
    parser.add_argument("--victims", type=int, default=20, help="victim queries")
    parser.add_argument("--benign", type=int, default=10, help="benign users before the attacker")
    parser.add_argument("--max-tokens", type=int, default=40, help="tokens the agent generates per answer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output folder (default .rvu/memory_poisoning/agent)")
    args = parser.parse_args()
    out = args.out or state_dir() / "memory_poisoning" / "agent"
    frame = load_dataset(load_catalog().datasets["minja"], default_dataset_source()).frame
    plan = plan_minja(
        minja_victims(frame),
        indication_templates(),
        args.victim,
        n_attack=args.attack,
        n_victims=args.victims,
        n_benign=args.benign,
        seed=args.seed,
    )
    profile, store = load_model_config().profile("tiny"), ModelStore()
    embedder = SentenceEmbedder(store.resolve("embedder", profile["embedder"]).path)
    resolved = store.resolve("llm", profile["llm"])
    llm = LlamaCppChatModel(resolved.path, n_ctx=2048, name=resolved.name)
    start = time.perf_counter()
    config = AgentConfig(max_tokens=args.max_tokens, seed=args.seed)
    results = minja_agent_study(plan, llm, embedder, config=config, progress=lambda m: print(m, flush=True))
    files = write_agent_outputs(results, plan, out, llm=resolved.name, config=asdict(config))
    print(files["table_md"].read_text())
    print(f"wall time {time.perf_counter() - start:.0f} s; outputs in {out}")


if __name__ == "__main__":
    main()
