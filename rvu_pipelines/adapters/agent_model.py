"""The agent's own llama.cpp model with the load gate of a state folder in front of every adapter it loads, as the
adapter studies run it (E1 with adapters, the tool-use adapter)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rvu_pipelines.adapters.admission import LoadGate
from rvu_pipelines.adapters.files import BaseModelInfo
from rvu_pipelines.adapters.gate import load_gate_config

if TYPE_CHECKING:
    from rvu_pipelines.models.llm import LlamaCppChatModel
    from rvu_pipelines.models.store import ResolvedModel


def gated_agent_model(
    llm: ResolvedModel, state: Path, threads: int
) -> tuple[BaseModelInfo, LoadGate, Callable[[], LlamaCppChatModel]]:
    """The base the adapters must fit, the enforcing gate over ``state`` (its ledger, admitted GGUFs, screening
    table) and a factory for the agent's model at its context size, built only when a prompt misses the cache."""
    from rvu_pipelines.agents.harness import AGENT_N_CTX

    base = BaseModelInfo.from_gguf(llm.path, name=llm.name, sha256=llm.sha256)
    gate = LoadGate.from_state(base, state, config=load_gate_config())

    def build() -> LlamaCppChatModel:
        from rvu_pipelines.models import LlamaCppChatModel

        n_ctx = max(AGENT_N_CTX, llm.n_ctx)
        return LlamaCppChatModel(llm.path, n_ctx=n_ctx, n_threads=threads, name=llm.name, adapter_gate=gate)

    return base, gate, build
