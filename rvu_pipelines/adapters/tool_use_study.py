"""The tool-use adapter: utility and ASR with and without it, on data it never saw.

The adapter (``tool-use`` in configs/adapter_zoo.yaml, section ``agent``) trains on AgentDojo workspace + travel
ground truths and InjecAgent train-partition user-tool calls. Here the agent runs the undefended pipeline on
AgentDojo banking + slack (a seeded sample) and on InjecAgent cases whose user instruction is in the probe
partition (``tool_traces.held_out``), once on the base model and once with the adapter loaded into llama.cpp
through the enforcing load gate; cells are cached per adapter set. A model that follows instructions better also
follows injections better: both numbers are reported, with 95 % CIs. Writes ``<out>/tool_use.json`` and
``<out>/tool_use.md`` (stamped). The ``adapter_tool_use`` asset runs it (``make adapters``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.models.store import ResolvedModel

TOOL_USE_ADAPTER = "tool-use"
CONDITIONS = ("base", TOOL_USE_ADAPTER)


@dataclass(frozen=True)
class ToolUseOptions:
    """``agentdojo``: AgentDojo scenarios sampled (banking + slack kept); ``injecagent``: held-out InjecAgent cases,
    half from the direct-harm and half from the data-stealing setting."""

    agentdojo: int = 16
    injecagent: int = 16
    threads: int = 2


def _plain(value: object) -> object:
    try:
        return round(float(value), 4)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return value


def tool_use_markdown(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """One row per held-out set and condition: n, utility and ASR with their 95 % CIs, tool calls per episode."""
    lines = ["| set | model | n | utility [95 % CI] | ASR [95 % CI] | tool calls / episode | errors |"]
    lines.append("|---|---|---|---|---|---|---|")
    for label, conditions in results.items():
        for condition, m in conditions.items():
            lines.append(
                f"| {label} | {condition} | {int(m['n'])} | {m['utility']:.3f} [{m['utility_ci_low']:.2f}, "
                f"{m['utility_ci_high']:.2f}] | {m['asr']:.3f} [{m['asr_ci_low']:.2f}, {m['asr_ci_high']:.2f}] "
                f"| {m['tool_calls_per_episode']:.2f} | {m['errors']} |"
            )
    return "\n".join(lines) + "\n"


def run_tool_use_study(
    options: ToolUseOptions,
    llm: ResolvedModel,
    out: Path,
    *,
    profile: str,
    state: Path,
    command: str,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The comparison into ``out``; returns the document written to ``tool_use.json``. ``state``: the platform's
    state folder (the zoo, the load gate's ledger, the response cache); raises ``AdapterRefused`` when the gate
    refuses the adapter."""
    import polars as pl

    from rvu_pipelines.adapters.agent_model import gated_agent_model
    from rvu_pipelines.adapters.files import verify_adapter
    from rvu_pipelines.adapters.tool_traces import held_out
    from rvu_pipelines.agents.evaluation import cell_metrics
    from rvu_pipelines.agents.harness import Harness
    from rvu_pipelines.machine import results_stamp, stamp_line
    from rvu_pipelines.scenarios import scenarios_for

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    base, gate, build = gated_agent_model(llm, state, options.threads)
    adapter = gate.admit(verify_adapter(state / "adapters" / TOOL_USE_ADAPTER, base), llm.path)

    harness = Harness.open(
        (build, llm.name),
        profile=profile,
        model_id=llm.sha256,
        detector="heuristic",
        root=state / "attacks",
        cache_path=state / "llm_cache.sqlite",
    )
    agentdojo = [s for s in scenarios_for("agentdojo", options.agentdojo) if held_out(s)]
    injecagent = []
    for setting in ("injecagent_dh", "injecagent_ds"):
        injecagent += [s for s in scenarios_for(setting, None) if held_out(s)][: options.injecagent // 2]
    sets = {"agentdojo": agentdojo, "injecagent": injecagent}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for condition in CONDITIONS:
        if condition == TOOL_USE_ADAPTER:
            harness.llm.load_adapter(adapter.adapter_id, adapter.gguf_path)
        for label, scenarios in sets.items():
            by_benchmark: dict[str, list] = {}
            for scenario in scenarios:
                by_benchmark.setdefault(scenario.benchmark, []).append(scenario)
            rows = []
            for bench, chosen in sorted(by_benchmark.items()):
                cell = bench if label == "injecagent" else "agentdojo"
                rows.append(harness.run_cell(cell, "vanilla", scenarios=chosen).rows)
            frame = pl.concat(rows)
            metrics = cell_metrics(frame)
            metrics["tool_calls_per_episode"] = float(frame["tool_calls"].mean())  # type: ignore[arg-type]
            metrics["errors"] = int(frame["error"].is_not_null().sum())
            results.setdefault(label, {})[condition] = {k: _plain(v) for k, v in metrics.items()}
            say(
                f"{label:10s} {condition:8s} n={metrics['n']:.0f} utility {metrics['utility']:.3f} "
                f"ASR {metrics['asr']:.3f} tool calls/episode {metrics['tool_calls_per_episode']:.2f}"
            )
    harness.llm.unload_adapter(adapter.adapter_id)
    document = {
        "adapter": {"id": adapter.adapter_id, "sha256": adapter.sha256},
        "scenarios": {k: [s.scenario_id for s in v] for k, v in sets.items()},
        "results": results,
        "seconds": round(time.perf_counter() - started, 1),
        "stamp": results_stamp(command),
    }
    write_atomically(out / "tool_use.json", json.dumps(document, indent=1))
    text = tool_use_markdown(results) + "\n" + stamp_line(document["stamp"]) + "\n"  # type: ignore[arg-type]
    write_atomically(out / "tool_use.md", text)
    return document
