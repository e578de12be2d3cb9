"""The inline ``hfer`` defense's real cost: FPR on clean tool outputs, TPR on injected ones, latency per output.

    .venv/bin/python scripts/hfer_defense_cost.py                      # every AgentDojo suite + held-out sets
    .venv/bin/python scripts/hfer_defense_cost.py --per-source 40 --suites banking slack

The switch is the agent's own (``LazyHferDetector.for_profile``: the default profile's weights, calibrated on
20 examples of the BIPIA / InjecAgent calibration split, each class spread over both sets); it is scored on
AgentDojo's clean and injected tool outputs (ground-truth solutions executed with the suites' tools) and on
the held-out BIPIA / InjecAgent pairs. Writes ``<out>/hfer_cost.json`` and ``<out>/hfer_cost.md`` (stamped
with the commit, date and machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import polars as pl


def _sample(frame: pl.DataFrame, per_source: int, seed: int) -> pl.DataFrame:
    from rvu_pipelines.spectral.study import limit_groups

    parts = [limit_groups(frame.filter(pl.col("source") == s), per_source, seed) for s in sorted(set(frame["source"]))]
    return pl.concat(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", nargs="*", default=None, help="AgentDojo suites (default: all)")
    parser.add_argument("--per-source", type=int, default=120, help="examples per source (whole pairs)")
    parser.add_argument("--profile", default=None, help="model profile (default: the default profile)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".rvu/spectral")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from rvu_pipelines.machine import results_stamp, stamp_line
    from rvu_pipelines.spectral.agent_switch import LazyHferDetector
    from rvu_pipelines.spectral.data import load_spectral_datasets
    from rvu_pipelines.spectral.inline_cost import inline_cost
    from rvu_pipelines.spectral.tool_outputs import agentdojo_tool_outputs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = load_spectral_datasets()
    heldout = pl.concat([sets[name].filter(pl.col("split") == "heldout") for name in ("bipia", "injecagent")])
    examples = pl.concat([_sample(agentdojo_tool_outputs(suite_names=args.suites), args.per_source, args.seed),
                          _sample(heldout, args.per_source, args.seed)])  # fmt: skip
    detector = LazyHferDetector.for_profile(args.profile)
    started = time.perf_counter()

    def progress(i: int, n: int) -> None:
        if i % 25 == 0:
            print(f"  scored {i}/{n} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    cost = inline_cost(detector, examples, progress=progress)
    stamp = results_stamp(" ".join(["python scripts/hfer_defense_cost.py", *(argv or sys.argv[1:])]))
    document = {"stamp": stamp} | cost.as_dict()
    (out / "hfer_cost.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    cost.scores.write_csv(out / "hfer_cost_scores.csv")
    header = stamp_line(stamp)
    (out / "hfer_cost.md").write_text(header + "\n\n" + cost.markdown() + "\n", encoding="utf-8")
    print(header)
    print(cost.markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
