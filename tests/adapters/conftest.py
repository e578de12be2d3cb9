"""Fixtures of the adapter tests: a GGUF LoRA for the agent's real model, made in a second."""

from __future__ import annotations

import pytest
import torch

from rvu_pipelines.adapters.gguf_lora import write_gguf_lora
from rvu_pipelines.adapters.runtime import AgentAdapter, attention_heads
from rvu_pipelines.hashing import sha256_file


@pytest.fixture(scope="session")
def random_adapter(tiny_models, tmp_path_factory) -> AgentAdapter:
    """Rank 4 on v/o of every layer, seeded: changes the model's answers, as a harmful adapter would."""
    path = tiny_models["llm"].path
    n_head, n_head_kv = attention_heads(path)
    assert (n_head, n_head_kv) == (9, 3)  # SmolLM2-135M, read from the GGUF
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(30):
        for module, out in (("v_proj", 192), ("o_proj", 576)):
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(4, 576, generator=g) * 0.05
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out, 4, generator=g) * 0.05
    gguf_path = write_gguf_lora(
        tensors, rank=4, alpha=8, out_path=tmp_path_factory.mktemp("lora") / "a.gguf", n_head=9, n_head_kv=3
    )
    return AgentAdapter("noise-r4", "noise-r4", sha256_file(gguf_path), gguf_path, source="test", influence=0.4)
