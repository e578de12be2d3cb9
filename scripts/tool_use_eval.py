"""The tool-use adapter: utility and ASR with and without it, on data it never saw.

    .venv/bin/python scripts/tool_use_eval.py                       # 24 AgentDojo (banking+slack) + 24 InjecAgent
    .venv/bin/python scripts/tool_use_eval.py --agentdojo 8 --injecagent 8

The adapter (`tool-use` in configs/adapter_zoo.yaml, section `agent`) trains on AgentDojo workspace + travel
ground truths and InjecAgent train-partition user-tool calls (scripts/adapter_study.py --only tool-use). Here
the agent runs the undefended pipeline on AgentDojo banking + slack (a seeded sample) and on InjecAgent cases
whose user instruction is in the probe partition (adapters.tool_traces.held_out), once on the base model and
once with the adapter loaded into llama.cpp; cells are cached per adapter set. A model that follows
instructions better also follows injections better: both numbers are printed, with 95 % CIs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agentdojo", type=int, default=16, help="AgentDojo banking+slack scenarios (seeded sample)")
    parser.add_argument("--injecagent", type=int, default=16, help="held-out InjecAgent cases (dh and ds, half each)")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from rvu_pipelines.adapters.admission import LoadGate
    from rvu_pipelines.adapters.errors import AdapterRefused
    from rvu_pipelines.adapters.files import BaseModelInfo, verify_adapter
    from rvu_pipelines.adapters.gate import load_gate_config
    from rvu_pipelines.adapters.tool_traces import held_out
    from rvu_pipelines.adapters.zoo import zoo_root
    from rvu_pipelines.agents.harness import AGENT_N_CTX, Harness
    from rvu_pipelines.models import LlamaCppChatModel, ModelStore, load_model_config
    from rvu_pipelines.paths import state_dir
    from rvu_pipelines.scenarios import scenarios_for

    out = args.out or state_dir() / "adapter_study"
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    config = load_model_config()
    name = config.profile_name(args.profile)
    resolved = ModelStore().resolve("llm", config.profile(args.profile)["llm"])
    base = BaseModelInfo.from_gguf(resolved.path, name=resolved.name, sha256=resolved.sha256)
    gate = LoadGate.from_state(base, state_dir(), config=load_gate_config())
    try:
        adapter = gate.admit(verify_adapter(zoo_root() / "tool-use", base), resolved.path)
    except AdapterRefused as exc:
        print(f"The adapter gate refused tool-use ({exc.reason}): {exc}", file=sys.stderr)
        return 1

    def build() -> LlamaCppChatModel:
        n_ctx = max(AGENT_N_CTX, resolved.n_ctx)
        return LlamaCppChatModel(
            resolved.path, n_ctx=n_ctx, n_threads=args.threads, name=resolved.name, adapter_gate=gate
        )

    harness = Harness.open((build, resolved.name), profile=name, model_id=resolved.sha256, detector="heuristic")
    agentdojo = [s for s in scenarios_for("agentdojo", args.agentdojo) if held_out(s)]
    injecagent = []
    for setting in ("injecagent_dh", "injecagent_ds"):
        cases = [s for s in scenarios_for(setting, None) if held_out(s)]
        injecagent += cases[: args.injecagent // 2]
    sets = {"agentdojo": agentdojo, "injecagent": injecagent}
    results: dict[str, dict[str, object]] = {}
    for condition in ("base", "tool-use"):
        if condition == "tool-use":
            harness.llm.load_adapter(adapter.adapter_id, adapter.gguf_path)
        for label, scenarios in sets.items():
            benchmark = "agentdojo" if label == "agentdojo" else "injecagent_dh"
            by_benchmark: dict[str, list] = {}
            for scenario in scenarios:
                by_benchmark.setdefault(scenario.benchmark, []).append(scenario)
            rows = []
            for bench, chosen in sorted(by_benchmark.items()):
                run = harness.run_cell(bench if label == "injecagent" else benchmark, "vanilla", scenarios=chosen)
                rows.append(run.rows)
            import polars as pl

            from rvu_pipelines.agents.evaluation import cell_metrics

            frame = pl.concat(rows)
            metrics = cell_metrics(frame)
            metrics["tool_calls_per_episode"] = float(frame["tool_calls"].mean())
            metrics["errors"] = int(frame["error"].is_not_null().sum())
            results.setdefault(label, {})[condition] = {k: _plain(v) for k, v in metrics.items()}
            print(
                f"{label:10s} {condition:8s} n={metrics['n']:.0f} utility {metrics['utility']:.3f} "
                f"[{metrics['utility_ci_low']:.2f}, {metrics['utility_ci_high']:.2f}] ASR {metrics['asr']:.3f} "
                f"[{metrics['asr_ci_low']:.2f}, {metrics['asr_ci_high']:.2f}] tool calls/episode "
                f"{metrics['tool_calls_per_episode']:.2f}",
                flush=True,
            )
    harness.llm.unload_adapter(adapter.adapter_id)
    summary = {
        "adapter": {"id": adapter.adapter_id, "sha256": adapter.sha256},
        "scenarios": {k: [s.scenario_id for s in v] for k, v in sets.items()},
        "results": results,
        "seconds": round(time.perf_counter() - started, 1),
    }
    (out / "tool_use.json").write_text(json.dumps(summary, indent=1))
    print(f"written {out / 'tool_use.json'} in {summary['seconds']} s")
    return 0


def _plain(value: object) -> object:
    try:
        return round(float(value), 4)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return value


if __name__ == "__main__":
    sys.exit(main())
