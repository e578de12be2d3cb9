"""Benchmark the attack table's episode order: cell by cell vs scenario by scenario, side by side in one run.

Usage:  .venv/bin/python benchmarks/bench_cell_order.py [--benchmark bipia_table] [--n 12] [--full-sample 100]
            [--attacks no_attack native planted_call gcg_universal_call] [--results-dir DIR]

The same cells (``--benchmark`` × ``--attacks``, the undefended agent, ``--n`` held-out scenarios) run twice on the
real agent (llama.cpp, the tiny profile's GGUF), each time with a fresh model, an empty response cache and no KV
files on disk: once cell by cell (every scenario under the first attack, then under the next) and once scenario by
scenario (``Harness.run_cells``: one scenario under every attack, then the next). A scenario's prompts under two
attacks share everything up to the injection (system prompt, task, the tool output before the injection point);
cell by cell, a sample of ``--full-sample`` scenarios has pushed that prefix out of the RAM snapshots before the next
attack reaches the scenario. To show that at a bench's size, the RAM bound is the default bound's share of one
scenario in a ``--full-sample`` cell, times ``--n`` (``--full-sample 0`` keeps the default bound). Both orders must
give the same rows; the run fails if not.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_results import Row, add_results_dir_argument, record

DEFAULT_ATTACKS = ("no_attack", "native", "planted_call", "gcg_universal_call")
DEFAULT_RAM_BYTES = 512 << 20  # LlamaCppChatModel's prefix_cache_bytes
COLUMNS = ["scenario_id", "attack", "episode_key", "attack_succeeded", "utility", "judge", "steps"]


def run_order(order: str, benchmark: str, attacks: list[str], n: int, ram_bytes: int, folder: Path) -> dict:
    """One order's wall time, inference seconds, reused prompt tokens and rows."""
    from rvu_pipelines.agents.harness import AGENT_N_CTX, Harness
    from rvu_pipelines.models import LlamaCppChatModel, ModelStore, load_model_config
    from rvu_pipelines.redteam.table import heldout_sample

    config = load_model_config()
    resolved = ModelStore().resolve("llm", config.profile("tiny")["llm"])
    model = LlamaCppChatModel(
        resolved.path,
        n_ctx=max(AGENT_N_CTX, resolved.n_ctx),
        name=resolved.name,
        model_sha256=resolved.sha256,
        prefix_reuse="ram",  # no KV files: neither order starts from the other's
        prefix_cache_bytes=ram_bytes,
    )
    harness = Harness.open(
        model,
        profile="tiny",
        model_id=resolved.sha256,
        detector="heuristic",
        root=folder / "attacks",
        cache_path=folder / "llm_cache.sqlite",
        gguf_path=resolved.path,
    )
    scenarios = heldout_sample(benchmark, n)
    started = time.perf_counter()
    works = [harness.plan_cell(benchmark, "vanilla", attack=attack, scenarios=scenarios) for attack in attacks]
    if order == "cells":
        runs = [harness.run_cells([work], progress=False)[0] for work in works]
    else:
        runs = harness.run_cells(works, progress=False)
    wall = time.perf_counter() - started
    import polars as pl

    rows = pl.concat([run.rows.select(COLUMNS) for run in runs]).sort("attack", "scenario_id")
    store = model.prefix_store
    return {
        "wall": wall,
        "inference": sum(run.inference_seconds for run in runs),
        "reused_tokens": store.reused_tokens if store is not None else 0,
        "episodes": sum(run.new_episodes for run in runs),
        "rows": rows,
        "asr": {run.spec.attack: int(run.rows["attack_succeeded"].sum()) for run in runs},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="bipia_table")
    parser.add_argument("--attacks", nargs="+", default=list(DEFAULT_ATTACKS))
    parser.add_argument("--n", type=int, default=12, help="held-out scenarios per cell")
    parser.add_argument(
        "--full-sample", type=int, default=100, help="the cell size the RAM bound is scaled to (0: the default bound)"
    )
    add_results_dir_argument(parser)
    args = parser.parse_args(argv)
    if args.n < 2 or len(args.attacks) < 2:
        parser.error("--n must be at least 2 and --attacks name at least two attacks (one order is the other)")
    ram = DEFAULT_RAM_BYTES if args.full_sample <= 0 else max(1, DEFAULT_RAM_BYTES * args.n // args.full_sample)
    print(
        f"{args.benchmark}: {args.n} held-out scenarios x {len(args.attacks)} attacks, undefended; "
        f"RAM KV snapshots bounded at {ram / 2**20:.0f} MiB",
        flush=True,
    )
    results = {}
    for order in ("cells", "scenarios"):
        with tempfile.TemporaryDirectory(prefix=f"rvu-bench-order-{order}-") as folder:
            os.environ["RVU_KV_CACHE_DIR"] = str(Path(folder) / "kv")
            results[order] = run_order(order, args.benchmark, args.attacks, args.n, ram, Path(folder))
        r = results[order]
        print(
            f"  {order:>9} first: {r['wall']:7.1f} s wall, {r['inference']:7.1f} s inference, "
            f"{r['reused_tokens']:,} prompt tokens reused, {r['episodes']} episodes, ASR {r['asr']}",
            flush=True,
        )
    if not results["cells"]["rows"].equals(results["scenarios"]["rows"]):
        print("FAIL: the two orders gave different rows", file=sys.stderr)
        return 1
    cells, scenarios = results["cells"], results["scenarios"]
    print(f"Same rows in both orders. Scenario by scenario: {cells['wall'] / scenarios['wall']:.2f}x faster (wall).")
    label = f"{args.benchmark}, {args.n} scenarios x {len(args.attacks)} attacks"
    rows = [
        Row(
            f"attack cells wall ({label})",
            "cell by cell",
            cells["wall"],
            "scenario by scenario",
            scenarios["wall"],
            "s",
            False,
        ),
        Row(
            f"attack cells LLM inference ({label})",
            "cell by cell",
            cells["inference"],
            "scenario by scenario",
            scenarios["inference"],
            "s",
            False,
        ),
    ]
    record(__file__, rows, args.results_dir, argv if argv is not None else sys.argv[1:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
