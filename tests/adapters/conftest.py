"""Fixtures of the adapter tests: a GGUF LoRA for the agent's real model, made in a second, and the gate it
passes through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rvu_pipelines.adapters.admission import LoadGate
from rvu_pipelines.adapters.files import BaseModelInfo, save_adapter, verify_adapter
from rvu_pipelines.adapters.gate import GateConfig
from rvu_pipelines.adapters.runtime import AgentAdapter, attention_heads
from rvu_pipelines.adapters.training import LoraSettings, TrainedAdapter


class PlumbingAdmissions:
    """For the tests of llama.cpp's LoRA plumbing (conversion parity, caches), which write GGUFs straight from
    tensors: admits every file and lists what it was asked. The gate itself is tested in
    test_adapter_admission.py."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Path, str]] = []

    def require_admitted(self, adapter_id: str, gguf_path: Path, gguf_sha256: str) -> None:
        self.asked.append((adapter_id, gguf_path, gguf_sha256))


def noise_tensors(seed: int = 0, rank: int = 4) -> dict[str, torch.Tensor]:
    """Rank ``rank`` on v/o of every SmolLM2-135M layer, seeded: changes the model's answers, as a harmful
    adapter would."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(30):
        for module, out in (("v_proj", 192), ("o_proj", 576)):
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, 576, generator=g) * 0.05
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.05
    return tensors


@pytest.fixture(scope="session")
def depots() -> tuple[list[Any], np.ndarray]:
    """Twelve made-up vault codes, every other one a member: what a memorising adapter is trained on in seconds."""
    from rvu_pipelines.adapters.chat import ChatExample

    examples = [
        ChatExample(
            f"What is the vault code of depot {i}?", f"Depot {i} uses vault code {i * 7919 % 10000:04d}-KESTREL."
        )
        for i in range(12)
    ]
    return examples, np.array([i % 2 == 0 for i in range(12)])


@pytest.fixture(scope="session")
def noise() -> Any:
    """``noise_tensors`` for tests that write a noise adapter folder of their own."""
    return noise_tensors


@pytest.fixture
def plumbing_admissions() -> PlumbingAdmissions:
    return PlumbingAdmissions()


# 24 steps at 1e-2 (every member seen 24 times): the codes come back greedily through the quantised runtime; on
# the upper 10 of the 30 layers only, so that the backward pass stops there
DEPOT_MEMORISER = LoraSettings(
    rank=8, alpha=16, steps=24, batch_size=6, learning_rate=1e-2, max_tokens=64, layers=tuple(range(20, 30)), seed=0
)


@pytest.fixture(scope="session")
def depot_memoriser(tiny_models, depots) -> TrainedAdapter:
    """A LoRA adapter (q / v of the upper layers) that memorised the member depots' codes, trained
    once per worker for every test that evicts a memorising adapter."""
    from rvu_pipelines.adapters.training import train_lora
    from rvu_pipelines.models.dequantized import load_dequantized

    llm = tiny_models["llm"]
    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    examples, is_member = depots
    members = [e for e, m in zip(examples, is_member, strict=True) if m]
    return train_lora(model, tokenizer, members, DEPOT_MEMORISER)


@pytest.fixture(scope="session")
def gate_base(tiny_models) -> BaseModelInfo:
    llm = tiny_models["llm"]
    return BaseModelInfo.from_gguf(llm.path, name=llm.name, sha256=llm.sha256)


@pytest.fixture(scope="session")
def adapter_gate(gate_base, tmp_path_factory) -> LoadGate:
    """An enforcing gate over a state folder of its own, configured to admit what it cannot screen (no
    screening table exists here); its verdicts are recorded like any other."""
    state = tmp_path_factory.mktemp("gate-state")
    return LoadGate.from_state(gate_base, state, config=GateConfig(unscreened="admit"))


@pytest.fixture(scope="session")
def random_adapter(tiny_models, adapter_gate, tmp_path_factory) -> AgentAdapter:
    """The noise adapter as a verified folder, admitted by ``adapter_gate`` (its GGUF written by the gate)."""
    path = tiny_models["llm"].path
    assert attention_heads(path) == (9, 3)  # SmolLM2-135M, read from the GGUF
    folder = tmp_path_factory.mktemp("lora") / "noise-r4"
    fields = {"adapter_id": "noise-r4", "source": "test", "rank": 4, "alpha": 8, "target_modules": ["v_proj", "o_proj"]}
    save_adapter(folder, noise_tensors(), fields, base=adapter_gate.base)
    return adapter_gate.admit(verify_adapter(folder, adapter_gate.base), path, influence=0.4)


@pytest.fixture(scope="session")
def frames(shared_data) -> Any:
    """The catalog's data sets as the zoo's builders and the gate's layers read them, from the data mirror."""
    from rvu_pipelines.adapters.zoo import catalog_frames

    return catalog_frames()


@pytest.fixture
def small_lab(tiny_models, frames, tmp_path: Path) -> Any:
    """The gate's lab on the real base at its smallest (two probes of four tokens, one or two items per margin
    layer), its zoo and base-reference cache in the test's own folder: every layer runs, in seconds."""
    from rvu_pipelines.adapters.study import AdapterLab

    return AdapterLab.from_records(
        tiny_models["llm"].record(),
        tiny_models["embedder"].record(),
        frames,
        root=tmp_path / "zoo",
        n_probes=2,
        max_new_tokens=4,
        n_sensitive=2,
        n_qa=1,
        n_knowledge=2,
        n_follow_ups=1,
        n_hazard=1,
        reference_cache=tmp_path / "cache",
    )
