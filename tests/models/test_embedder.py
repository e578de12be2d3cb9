from __future__ import annotations

import numpy as np

from rvu_pipelines.models.embedder import SentenceEmbedder
from rvu_pipelines.smoke import run_embedder_smoke


def test_minilm_embeds_normalised_and_separates_paraphrases(tiny_models) -> None:
    embedder = SentenceEmbedder(tiny_models["embedder"].path)
    vectors = embedder.encode(["a cat sat on the mat", "a kitten rested on the rug"])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    smoke = run_embedder_smoke(embedder, batch=8)
    assert smoke.separates_paraphrase and smoke.paraphrase_cosine > 0.6
