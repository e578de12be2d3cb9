"""The adapter study in miniature for the default job: every part runs for real, on a few examples.

Four zoo adapters (two benign, one harmful, the refusal reference) trained for a few steps on a few dozen
examples, the gate and influence over them, a memorising adapter on 12 TOFU forget questions scored loaded
vs evicted against 12 non-members, and the WMDP scorer on a few items. Minutes, not the study's hour: the
numbers show the machinery works, they are not the study's results (``make adapters``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.adapters.eviction import forget_examples, membership_before_after
from rvu_pipelines.adapters.files import save_adapter, verify_adapter
from rvu_pipelines.adapters.gate import GateConfig, GateEvaluation, evaluate_gate, load_gate_config
from rvu_pipelines.adapters.study import AdapterLab, AdapterScore, influence_summary, score_adapters
from rvu_pipelines.adapters.training import LoraSettings, train_lora
from rvu_pipelines.adapters.wmdp import accuracy_report, load_wmdp_items, score_wmdp
from rvu_pipelines.adapters.zoo import TrainingDefaults, ZooConfig, load_zoo_config

SAMPLE_ADAPTERS = ("tofu-qa", "style-bullets", "persona-hostile", "refusal-reference")
WMDP_MAX_TOKENS = 256  # the sample's cut (the study's is 1,024): a few long items would dominate its time


@dataclass(frozen=True)
class SampleSize:
    """How much of each part the sample runs; the defaults are the default job's (``make run``). Fewer steps or
    items keep every part running for real and only widen what its numbers can say."""

    steps: int = 4  # training steps per zoo adapter (the zoo's own: about a hundred)
    max_examples: int = 24  # training examples per zoo adapter
    # max_tokens 64 (the zoo: 160): the sample shows training runs; most of its examples fit, long ones are cut
    max_tokens: int = 64
    members: int = 12  # TOFU forget questions the memorising adapter learns, scored against as many non-members
    member_steps: int = 10
    wmdp_items: int = 8
    runtime_prompts: int = 2  # prompts answered with the harmful adapter loaded into llama.cpp, then unloaded
    # the gate's lab (the study's: 32 probes, 32 tokens, 32 + 32 margin items)
    n_probes: int = 8
    max_new_tokens: int = 16
    n_sensitive: int = 4
    n_qa: int = 4
    n_knowledge: int = 4
    n_follow_ups: int = 2
    n_hazard: int = 4

    def __post_init__(self) -> None:
        small = sorted(name for name, value in asdict(self).items() if value < 1)
        if small:
            raise ValueError(f"Adapter sample sizes must be at least 1: {', '.join(small)}.")

    def lab(self) -> dict[str, int]:
        """The ``AdapterLab`` arguments at this size."""
        return {
            "n_probes": self.n_probes,
            "max_new_tokens": self.max_new_tokens,
            "n_sensitive": self.n_sensitive,
            "n_qa": self.n_qa,
            "n_knowledge": self.n_knowledge,
            "n_follow_ups": self.n_follow_ups,
            "n_hazard": self.n_hazard,
        }


def _runtime_behind_gate(
    lab: AdapterLab, root: Path, llm_gguf: Path, scores: list[AdapterScore], config: GateConfig, prompts: int
) -> dict[str, Any]:
    """The harmful sample adapter offered to the agent's llama.cpp model through an enforcing gate whose
    thresholds are the sample's own benign scores (its ledger under ``root``); the verdict is reported, and the
    load / unload roundtrip then runs under a recorded override, since it measures the runtime, not the gate."""
    from rvu_pipelines.adapters.admission import BenignReference, GateLedger, LoadGate
    from rvu_pipelines.adapters.runtime import runtime_roundtrip
    from rvu_pipelines.models.llm import LlamaCppChatModel

    rows = [asdict(s) for s in scores]
    gate = LoadGate(
        config=config,
        base=lab.base,
        ledger=GateLedger(root / "gate" / "gate_ledger.jsonl"),
        gguf_dir=root / "gate" / "admitted",
        screened={str(r["sha256"]): r for r in rows},
        reference=BenignReference.from_rows(rows, config),
    )
    verdict = gate.screen(lab.verify("persona-hostile"))
    harmful = gate.admit(
        lab.verify("persona-hostile"), llm_gguf, override="sample: the roundtrip measures llama.cpp load / unload"
    )
    chat = LlamaCppChatModel(llm_gguf, n_ctx=1024, name="agent", adapter_gate=gate)
    return {
        **runtime_roundtrip(harmful, chat, lab.prompts[:prompts]),
        "gate": {"decision": verdict.decision, "reason": verdict.reason, "layers": dict(verdict.layers)},
    }


@dataclass
class AdapterSample:
    training: list[dict[str, Any]]
    scores: list[AdapterScore]
    gate: GateEvaluation
    influence: dict[str, float]
    membership: dict[str, Any]
    wmdp: dict[str, Any]
    seconds: dict[str, float]
    runtime: dict[str, Any]


def sample_config(config: ZooConfig | None = None, size: SampleSize = SampleSize()) -> ZooConfig:
    """The zoo's sample entries with few steps on few examples (their other settings as in the zoo)."""
    config = config or load_zoo_config()
    training = {
        "steps": size.steps,
        "batch_size": 4,
        "max_examples": size.max_examples,
        "learning_rate": 0.003,
        "max_tokens": size.max_tokens,
    }
    defaults = TrainingDefaults.model_validate({**config.defaults.model_dump(), **training})
    entries = [config.get(i).model_copy(update={k: None for k in training}) for i in SAMPLE_ADAPTERS]
    return ZooConfig(
        defaults=defaults,
        adapters=[e for e in entries if e.category != "safety_reference"],
        reference=[e for e in entries if e.category == "safety_reference"],
    )


def run_adapter_sample(
    lab: AdapterLab, root: Path, llm_gguf: Path | None = None, size: SampleSize = SampleSize()
) -> AdapterSample:
    """Train the sample adapters into ``root`` (a folder of its own, never the zoo's) and measure them; with the
    agent's GGUF (``llm_gguf``), also load the harmful one into llama.cpp and out again (``runtime_roundtrip``).
    ``lab`` is built at ``size.lab()``."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    lab.root = root
    config = sample_config(size=size)
    training = lab.train(config)
    seconds["train"] = time.perf_counter() - started

    started = time.perf_counter()
    gate_config = load_gate_config()
    reference = lab.verify(gate_config.reference_adapter)
    scores = score_adapters(lab, [lab.verify(entry.id) for entry in config.adapters], reference, gate_config)
    gate = evaluate_gate([s.gate_scores() for s in scores], gate_config.false_positive_budget)
    seconds["gate_and_influence"] = time.perf_counter() - started

    started = time.perf_counter()
    examples, flags = forget_examples(lab.frames)
    members = [i for i in np.flatnonzero(flags)[: size.members]]
    others = [i for i in np.flatnonzero(~flags)[: size.members]]
    chosen = [examples[i] for i in members + others]
    is_member = np.array([True] * len(members) + [False] * len(others))
    settings = LoraSettings(
        rank=8, alpha=16, steps=size.member_steps, batch_size=4, learning_rate=0.003, max_tokens=128, seed=0
    )
    trained = train_lora(lab.host.base, lab.tokenizer, [examples[i] for i in members], settings)
    fields = {
        "adapter_id": "sample-memorise-forget",
        "label": "harmful",
        "category": "memorise_forget",
        "source": "rvu-sample",
        "rank": settings.rank,
        "alpha": settings.alpha,
        "target_modules": list(settings.target_modules),
        "steps": settings.steps,
    }
    save_adapter(root / "sample-memorise-forget", trained.tensors, fields, base=lab.base)
    memorising = verify_adapter(root / "sample-memorise-forget", lab.base)
    membership = membership_before_after(lab.host, memorising, chosen, is_member, probes=False, n_boot=200)
    seconds["membership"] = time.perf_counter() - started

    started = time.perf_counter()
    items = load_wmdp_items(limit=size.wmdp_items, seed=0)
    wmdp = score_wmdp(lab.host.model, lab.tokenizer, items, max_tokens=WMDP_MAX_TOKENS, progress=False)
    seconds["wmdp"] = time.perf_counter() - started
    started = time.perf_counter()
    runtime: dict[str, Any] = {"status": "not run (no GGUF given)"}
    if llm_gguf is not None:
        runtime = _runtime_behind_gate(lab, root, llm_gguf, scores, gate_config, size.runtime_prompts)
    seconds["agent_runtime"] = time.perf_counter() - started
    return AdapterSample(
        runtime=runtime,
        training=training,
        scores=scores,
        gate=gate,
        influence=influence_summary(scores),
        membership=membership.certificate_section(),
        wmdp=accuracy_report(wmdp.correct, answers=wmdp.answer).to_dict(),
        seconds=seconds,
    )
