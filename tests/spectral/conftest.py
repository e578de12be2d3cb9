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


@pytest.fixture(scope="session")
def hfer_detector(spectral_model, spectral_sets):
    """A switch calibrated on 8 short context-verification examples, layers 2-3 (early exit: fast)."""
    from rvu_pipelines.spectral.detector import HferDetector

    return HferDetector.calibrated(spectral_model, spectral_sets["context_verification"], size=8, layers=[2, 3])
