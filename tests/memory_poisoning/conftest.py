"""Fixtures for the memory-poisoning tests: the real AgentPoison / MINJA frames and the real MiniLM."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from rvu_pipelines.data.parsers import agentpoison_strategyqa, minja


def _files(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="session")
def strategyqa_frame(shared_data: Path) -> pl.DataFrame:
    return agentpoison_strategyqa(_files(shared_data / "agentpoison_strategyqa"))


@pytest.fixture(scope="session")
def minja_frame(shared_data: Path) -> pl.DataFrame:
    return minja(_files(shared_data / "minja"))


@pytest.fixture(scope="session")
def embedder(tiny_models):
    """MiniLM for every module on this worker, each distinct text embedded once: the modules embed the same
    StrategyQA / MINJA records again (``tests/models`` tests the bare embedder)."""
    from rvu_pipelines.models.embedder import SentenceEmbedder
    from rvu_pipelines.models.embedding import RememberingEmbedder

    return RememberingEmbedder(SentenceEmbedder(tiny_models["embedder"].path))


@pytest.fixture(scope="session")
def study_embeddings(embedder):
    """One embedding cache for every study built in this process, as one study run shares it across its cells:
    the same StrategyQA / MINJA records are embedded once (the modules using it share a test worker,
    ``tests/conftest.py`` SHARED_WORKER)."""
    from rvu_pipelines.memory_poisoning.study_cells import EmbeddingCache

    return EmbeddingCache(embedder)


@pytest.fixture(scope="session")
def injecagent_frame(shared_data: Path) -> pl.DataFrame:
    from rvu_pipelines.data.parsers import injecagent

    return injecagent({p.name: p for p in (shared_data / "injecagent").rglob("*") if p.is_file()})
