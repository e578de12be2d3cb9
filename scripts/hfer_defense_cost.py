"""The inline ``hfer`` defense's real cost: FPR on clean tool outputs, TPR on injected ones, latency per output.

    .venv/bin/python scripts/hfer_defense_cost.py                      # every AgentDojo suite + held-out sets
    .venv/bin/python scripts/hfer_defense_cost.py --per-source 40 --suites banking slack

The switch is the agent's own (``LazyHferDetector.for_profile``: the default profile's weights, layer and
statistic chosen on 20 examples of the BIPIA / InjecAgent calibration split, each class spread over both
sets), once per threshold policy: ``benign_fpr`` (the threshold at 5 % FPR on 100 clean tool outputs of
AgentDojo's *calibration* user tasks) and ``bayes`` (the seed's mixture threshold from the 20 examples). Both
are scored on AgentDojo's clean and injected tool outputs of the *held-out* user tasks (ground-truth solutions
executed with the suites' tools) and on the held-out BIPIA / InjecAgent pairs. Writes ``<out>/hfer_cost.json``
and ``<out>/hfer_cost.md`` (stamped with the command, commit, date and machine).
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
    parser.add_argument("--policies", nargs="*", default=["benign_fpr", "bayes"], help="threshold policies")
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
    tool_outputs = agentdojo_tool_outputs(suite_names=args.suites).filter(pl.col("split") == "heldout")
    examples = pl.concat(
        [_sample(tool_outputs, args.per_source, args.seed), _sample(heldout, args.per_source, args.seed)]
    )
    stamp = results_stamp(" ".join(["python scripts/hfer_defense_cost.py", *(argv or sys.argv[1:])]))
    document: dict[str, object] = {"stamp": stamp}
    sections = [stamp_line(stamp)]
    for policy in args.policies:
        detector = LazyHferDetector.for_profile(args.profile, threshold_policy=policy)
        started = time.perf_counter()

        def progress(i: int, n: int, policy: str = policy, started: float = started) -> None:
            if i % 25 == 0:
                print(
                    f"  {policy}: scored {i}/{n} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True
                )

        cost = inline_cost(detector, examples, progress=progress)
        document[policy] = cost.as_dict()
        cost.scores.write_csv(out / f"hfer_cost_scores_{policy}.csv")
        sections += ["", f"Threshold policy `{policy}`:", "", cost.markdown()]
    (out / "hfer_cost.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "hfer_cost.md").write_text("\n".join(sections) + "\n", encoding="utf-8")
    print("\n".join(sections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
