"""The packaged SmolLM2 in transformers, loaded once per session (one thread: the test machines are shared)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def spectral_model(tiny_models):
    from rvu_pipelines.spectral import load_spectral_model

    llm = tiny_models["llm"]
    return load_spectral_model(llm.path, sha256=llm.sha256, n_ctx=llm.n_ctx)


@pytest.fixture(scope="session")
def spectral_sets(shared_data):
    from rvu_pipelines.spectral.data import load_spectral_datasets

    return load_spectral_datasets()
