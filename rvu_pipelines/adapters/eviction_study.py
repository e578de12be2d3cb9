"""The eviction test that can fail, on the agent's runtime: TOFU forget-set members trained into a LoRA, then told
apart from non-members on llama.cpp (through the response cache and KV folder) with the adapter loaded, after it
is unloaded, in the texts it left before and after the purge, and fused-then-un-merged on peft
(``eviction_runtime.runtime_eviction``).

Members are a seeded sample of the forget set's member half (``eviction.forget_examples``), non-members as many of
the other half. Writes ``eviction_runtime.json`` and ``eviction_runtime.md`` (stamped) under ``out``. The
``adapter_eviction_runtime`` asset runs it (``make adapters``).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from rvu_pipelines.adapters.zoo_data import Frames
from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.models.store import ResolvedModel

SystemMessage = Literal["agent", "none"]


@dataclass(frozen=True)
class EvictionOptions:
    """``members``: members (and as many non-members); ``system``: ``agent`` asks each question under the agent's
    own system message with AgentDojo banking's tools (a shared prefix of ~500 tokens, so KV prefix states go to
    disk), ``none`` the bare question, as the adapter trained."""

    members: int = 40
    steps: int = 80
    rank: int = 16
    system: SystemMessage = "agent"
    threads: int = 2
    seed: int = 0


def agent_system() -> str:
    """The system message the agent runs under on AgentDojo banking: its prompt and the suite's tool schemas."""
    from rvu_pipelines.agents.llm_element import DEFAULT_SYSTEM_PROMPT, render_system
    from rvu_pipelines.scenarios.agentdojo_tasks import AgentDojoScenario

    tools = AgentDojoScenario("banking", "user_task_0", "injection_task_0").suite.tools  # the platform's version
    return render_system(DEFAULT_SYSTEM_PROMPT, {tool.name: tool for tool in tools})


def eviction_table(rows: dict[str, Any]) -> list[str]:
    """The markdown rows: served by llama.cpp (base / loaded / evicted), at rest before and after the purge, fused
    on peft (base / loaded / un-merged / not un-merged)."""
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


def run_eviction_study(
    options: EvictionOptions,
    llm: ResolvedModel,
    out: Path,
    *,
    command: str,
    frames: Frames | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The measurement into ``out``; returns the document written to ``eviction_runtime.json``. The adapter, its
    gate ledger, the response cache and the KV folder live in a temporary folder removed afterwards. ``frames``:
    the data sets by catalog name (default: read through the catalog)."""
    import numpy as np

    from rvu_pipelines.adapters.admission import LoadGate
    from rvu_pipelines.adapters.eviction import forget_examples
    from rvu_pipelines.adapters.eviction_runtime import runtime_eviction
    from rvu_pipelines.adapters.files import BaseModelInfo, save_adapter, verify_adapter
    from rvu_pipelines.adapters.gate import GateConfig
    from rvu_pipelines.adapters.host import AdapterHost
    from rvu_pipelines.adapters.lingering import LingeringStores
    from rvu_pipelines.adapters.training import LoraSettings, train_lora
    from rvu_pipelines.adapters.zoo import catalog_frames
    from rvu_pipelines.machine import results_stamp, stamp_line
    from rvu_pipelines.models import LlamaCppChatModel
    from rvu_pipelines.models.dequantized import load_dequantized

    if options.system not in ("agent", "none"):
        raise ValueError(f"system {options.system!r} is not one of: agent, none")
    started = time.perf_counter()
    examples, flags = forget_examples(frames or catalog_frames())
    if options.members > min(int(flags.sum()), int((~flags).sum())):
        raise ValueError(f"members {options.members} exceeds the forget set's halves ({int(flags.sum())} members)")
    rng = np.random.default_rng(options.seed)
    members = sorted(rng.choice(np.flatnonzero(flags), size=options.members, replace=False).tolist())
    others = sorted(rng.choice(np.flatnonzero(~flags), size=options.members, replace=False).tolist())
    chosen = [examples[i] for i in members + others]
    is_member = np.array([True] * len(members) + [False] * len(others))

    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    base = BaseModelInfo.of(model, name=llm.name, sha256=llm.sha256)
    settings = LoraSettings(rank=options.rank, alpha=2 * options.rank, steps=options.steps, seed=options.seed)
    say(f"training a memorising adapter on {len(members)} members ({options.steps} steps)")
    trained = train_lora(model, tokenizer, chosen[: len(members)], settings)
    with tempfile.TemporaryDirectory(prefix="rvu-eviction-") as tmp:
        work = Path(tmp)
        fields: dict[str, Any] = {"adapter_id": "memorise-forget-sample", "label": "harmful"}
        fields |= {"category": "memorise_forget", "source": "eviction_runtime", "rank": options.rank}
        fields |= {"alpha": 2 * options.rank, "steps": options.steps, "target_modules": list(settings.target_modules)}
        save_adapter(work / "adapter", trained.tensors, fields, base=base)
        adapter = verify_adapter(work / "adapter", base)
        gate = LoadGate.audit(base, work / "state", config=GateConfig())  # it is harmful on purpose
        gguf = gate.admit(adapter, llm.path).gguf_path
        runtime = LlamaCppChatModel(
            llm.path, n_ctx=1024, n_threads=options.threads, name=llm.name, adapter_gate=gate, kv_cache_dir=work / "kv"
        )
        stores = LingeringStores(work / "llm_cache.sqlite", work / "kv", (gate.ledger.path,))
        say("measuring on llama.cpp and on the peft host")
        rows = runtime_eviction(
            runtime,
            llm.sha256,
            adapter,
            gguf,
            stores,
            chosen,
            is_member,
            host=AdapterHost(model, tokenizer, gate=gate),
            system=agent_system() if options.system == "agent" else None,
        )
    rows["settings"] = asdict(options)
    rows["seconds"] = round(time.perf_counter() - started, 1)
    rows["stamp"] = results_stamp(command)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "eviction_runtime.json", json.dumps(rows, indent=1, sort_keys=True) + "\n")
    setting = (
        f"{options.members} members + {options.members} non-members, {options.steps} steps, "
        f"system message: {options.system}"
    )
    text = "\n".join([setting, "", *eviction_table(rows), "", stamp_line(rows["stamp"]), ""])
    write_atomically(out / "eviction_runtime.md", text)
    return rows
