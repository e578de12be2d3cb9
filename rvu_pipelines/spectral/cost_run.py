"""The inline ``hfer`` defense's real cost: FPR on clean tool outputs, TPR on injected ones, latency per output.

The switch is the agent's own (``LazyHferDetector.for_profile``: the profile's weights, layer and statistic chosen
on 20 examples of the BIPIA / InjecAgent calibration split, each class spread over both sets), once per threshold
policy: ``benign_fpr`` (the threshold at 5 % FPR on 100 clean tool outputs of AgentDojo's *calibration* user
tasks) and ``bayes`` (the seed's mixture threshold from the 20 examples). Both are scored on AgentDojo's clean and
injected tool outputs of the *held-out* user tasks (ground-truth solutions executed with the suites' tools) and on
the held-out BIPIA / InjecAgent pairs. Writes ``<out>/hfer_cost.json`` and ``<out>/hfer_cost.md`` (stamped with the
command, commit, date and machine). The ``spectral_hfer_cost`` asset runs it (``make spectral``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from rvu_pipelines.atomic_write import write_atomically, write_stream_atomically
from rvu_pipelines.spectral.study_run import progress_reporter

COST_POLICIES = ("benign_fpr", "bayes")


@dataclass(frozen=True)
class CostOptions:
    """``suites``: AgentDojo suites (None: all); ``per_source``: examples per source (whole pairs)."""

    suites: tuple[str, ...] | None = None
    per_source: int = 120
    profile: str | None = None
    policies: tuple[str, ...] = COST_POLICIES
    seed: int = 0


def _sample(frame: pl.DataFrame, per_source: int, seed: int) -> pl.DataFrame:
    from rvu_pipelines.spectral.study import limit_groups

    parts = [limit_groups(frame.filter(pl.col("source") == s), per_source, seed) for s in sorted(set(frame["source"]))]
    return pl.concat(parts)


def run_cost(
    options: CostOptions,
    out: Path,
    *,
    command: str,
    frames: Mapping[str, pl.DataFrame] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The cost report into ``out`` (``command`` is what the stamp says produced it); returns the document.
    ``frames``: the parsed data sets by catalog name (``data.SOURCE_FRAMES``; default: read through the catalog)."""
    from rvu_pipelines.machine import results_stamp, stamp_line
    from rvu_pipelines.spectral.agent_switch import LazyHferDetector
    from rvu_pipelines.spectral.data import load_source_frames, spectral_sets
    from rvu_pipelines.spectral.inline_cost import inline_cost
    from rvu_pipelines.spectral.tool_outputs import agentdojo_tool_outputs

    unknown = sorted(set(options.policies) - set(COST_POLICIES))
    if unknown:
        raise ValueError(f"unknown threshold policies {unknown}; allowed values: {', '.join(COST_POLICIES)}")
    out.mkdir(parents=True, exist_ok=True)
    sets = spectral_sets(frames if frames is not None else load_source_frames())
    heldout = pl.concat([sets[name].filter(pl.col("split") == "heldout") for name in ("bipia", "injecagent")])
    suites = list(options.suites) if options.suites is not None else None
    tool_outputs = agentdojo_tool_outputs(suite_names=suites).filter(pl.col("split") == "heldout")
    examples = pl.concat(
        [_sample(tool_outputs, options.per_source, options.seed), _sample(heldout, options.per_source, options.seed)]
    )
    stamp = results_stamp(command)
    document: dict[str, Any] = {"stamp": stamp}
    sections = [stamp_line(stamp)]
    for policy in options.policies:
        detector = LazyHferDetector.for_profile(options.profile, threshold_policy=policy)
        cost = inline_cost(detector, examples, progress=progress_reporter(say, f"{policy}: scored", 25))
        document[policy] = cost.as_dict()
        write_stream_atomically(out / f"hfer_cost_scores_{policy}.csv", cost.scores.write_csv)
        sections += ["", f"Threshold policy `{policy}`:", "", cost.markdown()]
    write_atomically(out / "hfer_cost.json", json.dumps(document, indent=2, sort_keys=True) + "\n")
    write_atomically(out / "hfer_cost.md", "\n".join(sections) + "\n")
    say("\n".join(sections))
    return document
