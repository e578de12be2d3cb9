"""The eviction test that can fail, on the agent's runtime: TOFU forget-set members trained into a LoRA, then
told apart from non-members on llama.cpp (through the response cache and KV folder) with the adapter loaded,
after it is unloaded, in the texts it left before and after the purge, and fused-then-un-merged on peft.

    .venv/bin/python scripts/eviction_runtime.py                  # 40 members + 40 non-members, 80 steps
    .venv/bin/python scripts/eviction_runtime.py --members 16 --steps 40

Members are a seeded sample of the forget set's member half (``eviction.forget_examples``), non-members as many
of the other half. Writes ``eviction_runtime.json``, ``eviction_runtime.md`` and ``stamp.json`` under ``--out``
(default ``<RVU_HOME>/adapter_study/eviction_runtime``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _table(rows: dict[str, Any]) -> list[str]:
    lines = ["| path | state | verdict | AUROC | leak rate members / non-members |", "|---|---|---|---|---|"]
    for state in ("base", "loaded", "evicted"):
        r = rows["served"][state]
        lines.append(
            f"| served by llama.cpp | {state} | {r['verdict']} | {r['auroc']:.3f} [{r['auroc_ci'][0]:.3f}, "
            f"{r['auroc_ci'][1]:.3f}] | {r['member_leak_rate']:.2f} / {r['non_member_leak_rate']:.2f} |"
        )
    for state in ("before_purge", "after_purge"):
        r = rows["at_rest"][state]
        left = f"{r['left']['cached_answers']} cached answers, {r['left']['kv_states']} KV states"
        lines.append(
            f"| at rest ({left}) | {state.replace('_', ' ')} | {r['verdict']} | {r['auroc']:.3f} "
            f"[{r['auroc_ci'][0]:.3f}, {r['auroc_ci'][1]:.3f}] | {r['member_leak_rate']:.2f} / "
            f"{r['non_member_leak_rate']:.2f} |"
        )
    for state in ("base", "loaded", "unmerged", "not_unmerged"):
        r = rows.get("fused", {}).get(state)
        if r is not None:
            aurocs = ", ".join(f"{name} {value:.3f}" for name, value in r["auroc"].items())
            lines.append(f"| fused on peft (likelihood) | {state.replace('_', ' ')} | {r['verdict']} | {aurocs} | |")
    return lines


def agent_system() -> str:
    """The system message the agent runs under on AgentDojo banking: its prompt and the suite's tool schemas."""
    from rvu_pipelines.agents.llm_element import DEFAULT_SYSTEM_PROMPT, render_system
    from rvu_pipelines.scenarios.agentdojo_tasks import AgentDojoScenario

    tools = AgentDojoScenario("banking", "user_task_0", "injection_task_0").suite.tools  # the platform's version
    return render_system(DEFAULT_SYSTEM_PROMPT, {tool.name: tool for tool in tools})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=40, help="members (and as many non-members)")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument(
        "--system",
        choices=("agent", "none"),
        default="agent",
        help="agent: each question under the agent's own system message with AgentDojo banking's tools (a shared "
        "prefix of ~500 tokens, so KV prefix states go to disk); none: the bare question, as the adapter trained",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from rvu_pipelines.adapters.admission import LoadGate
    from rvu_pipelines.adapters.eviction import forget_examples
    from rvu_pipelines.adapters.eviction_runtime import runtime_eviction
    from rvu_pipelines.adapters.files import BaseModelInfo, save_adapter, verify_adapter
    from rvu_pipelines.adapters.gate import GateConfig
    from rvu_pipelines.adapters.host import AdapterHost
    from rvu_pipelines.adapters.lingering import LingeringStores
    from rvu_pipelines.adapters.training import LoraSettings, train_lora
    from rvu_pipelines.adapters.zoo import catalog_frames
    from rvu_pipelines.machine import stamp_line, write_stamp
    from rvu_pipelines.models import LlamaCppChatModel, ModelStore, load_model_config
    from rvu_pipelines.models.dequantized import load_dequantized
    from rvu_pipelines.paths import state_dir

    out = args.out or state_dir() / "adapter_study" / "eviction_runtime"
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    examples, flags = forget_examples(catalog_frames())
    rng = np.random.default_rng(0)
    members = sorted(rng.choice(np.flatnonzero(flags), size=args.members, replace=False).tolist())
    others = sorted(rng.choice(np.flatnonzero(~flags), size=args.members, replace=False).tolist())
    chosen = [examples[i] for i in members + others]
    is_member = np.array([True] * len(members) + [False] * len(others))

    llm = ModelStore().resolve("llm", load_model_config().profile(args.profile)["llm"])
    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    base = BaseModelInfo.of(model, name=llm.name, sha256=llm.sha256)
    settings = LoraSettings(rank=args.rank, alpha=2 * args.rank, steps=args.steps, seed=0)
    print(f"training a memorising adapter on {len(members)} members ({args.steps} steps) ...", flush=True)
    trained = train_lora(model, tokenizer, [chosen[i] for i in range(len(members))], settings)
    with tempfile.TemporaryDirectory(prefix="rvu-eviction-") as tmp:
        work = Path(tmp)
        fields: dict[str, Any] = {
            "adapter_id": "memorise-forget-sample",
            "label": "harmful",
            "category": "memorise_forget",
        }
        fields |= {"source": "eviction_runtime", "rank": args.rank, "alpha": 2 * args.rank, "steps": args.steps}
        fields |= {"target_modules": list(settings.target_modules)}
        save_adapter(work / "adapter", trained.tensors, fields, base=base)
        adapter = verify_adapter(work / "adapter", base)
        gate = LoadGate.audit(base, work / "state", config=GateConfig())  # it is harmful on purpose
        gguf = gate.admit(adapter, llm.path).gguf_path
        runtime = LlamaCppChatModel(
            llm.path, n_ctx=1024, n_threads=args.threads, name=llm.name, adapter_gate=gate, kv_cache_dir=work / "kv"
        )
        stores = LingeringStores(work / "llm_cache.sqlite", work / "kv", (gate.ledger.path,))
        print("measuring on llama.cpp and on the peft host ...", flush=True)
        rows = runtime_eviction(
            runtime,
            llm.sha256,
            adapter,
            gguf,
            stores,
            chosen,
            is_member,
            host=AdapterHost(model, tokenizer, gate=gate),
            system=agent_system() if args.system == "agent" else None,
        )
    rows["settings"] = {"members": args.members, "steps": args.steps, "rank": args.rank, "profile": args.profile}
    rows["settings"]["system"] = args.system
    rows["seconds"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eviction_runtime.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    stamp = json.loads(write_stamp(out).read_text())
    setting = f"{args.members} members + {args.members} non-members, {args.steps} steps, system message: {args.system}"
    text = "\n".join([setting, "", *_table(rows), "", stamp_line(stamp), ""])
    (out / "eviction_runtime.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
