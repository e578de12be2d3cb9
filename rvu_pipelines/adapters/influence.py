"""E5: gradient-free influence of an adapter from what it makes the model say (seed 000 §3.6).

For each probe prompt j the base model and the model with adapter a answer greedily; then
``I(a, j) = w_e·(1 − cos(emb(base_j), emb(adapted_j))) + w_t·(1 − Jaccard(words(base_j), words(adapted_j)))``
with the seed's w_e = 0.7, w_t = 0.3 and MiniLM sentence embeddings; ``I(a)`` is the mean over probes. It
feeds FROC's influence term for every entry produced under the adapter.

The seed reported I = 0.26 for one persona prompt standing in for an adapter; here it runs on real
adapters, and the ground-truth check is whether adapters trained on poisoned data score higher than
benign ones (AUROC over the zoo, ``influence_auroc``). Probe prompts are held-out rows
(``zoo_data.probe_prompts``): benign questions and adversarial ones.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rvu_pipelines.models.embedding import Embedder

EMBEDDING_WEIGHT = 0.7
TOKEN_WEIGHT = 0.3
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@dataclass(frozen=True)
class InfluenceScore:
    influence: float  # I(a): mean over probes
    embedding_distance: float  # mean 1 − cos
    token_divergence: float  # mean 1 − Jaccard
    per_probe: list[float]
    embedding_per_probe: list[float]  # 1 − cos per probe, in the probes' order


def influence(base_answers: Sequence[str], adapted_answers: Sequence[str], embedder: Embedder) -> InfluenceScore:
    if len(base_answers) != len(adapted_answers) or not base_answers:
        raise ValueError("Influence needs one adapted answer per base answer, and at least one probe.")
    # an empty answer embeds like any other string; cosine on the L2-normalised vectors
    vectors = embedder.encode([*base_answers, *adapted_answers])
    n = len(base_answers)
    cosine = np.sum(vectors[:n] * vectors[n:], axis=1)
    emb = 1.0 - np.clip(cosine, -1.0, 1.0)
    tok = np.array([1.0 - jaccard(words(b), words(a)) for b, a in zip(base_answers, adapted_answers, strict=True)])
    per_probe = EMBEDDING_WEIGHT * emb + TOKEN_WEIGHT * tok
    return InfluenceScore(
        float(per_probe.mean()),
        float(emb.mean()),
        float(tok.mean()),
        [float(x) for x in per_probe],
        [float(x) for x in emb],
    )


def influence_auroc(scores: Sequence[float], harmful: Sequence[bool]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score([int(h) for h in harmful], list(scores)))
