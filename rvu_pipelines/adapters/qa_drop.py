"""The gate's held-out QA layer: how much less likely an adapter makes correct answers it never trained on.

A misinformation adapter is trained to give wrong answers; one that degrades the model does so everywhere. Both
make correct answers to questions no adapter saw (the TOFU real-authors and world-facts *probe* partition, held
out from every zoo training set) less likely. The layer is the mean drop of the answers' token log-likelihood with
the adapter from the base's: likelihood, not generated text, so it costs one forward pass per batch and does not
depend on how an answer is phrased.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.membership import loss_score, token_logprobs
from rvu_pipelines.adapters.zoo_data import Frames, tofu_qa

N_QA = 32


def held_out_qa(frames: Frames, n: int = N_QA) -> list[ChatExample]:
    """The first ``n`` held-out QA pairs (probe partition of TOFU real authors + world facts)."""
    examples = tofu_qa(frames, {}, "probe").examples
    if len(examples) < n:
        raise ValueError(f"Only {len(examples)} held-out QA pairs, {n} asked for.")
    return list(examples[:n])


def answer_loglik(model: Any, tokenizer: Any, examples: Sequence[ChatExample]) -> np.ndarray:
    """Mean token log-likelihood of each reference answer under ``model``."""
    return np.array([loss_score(stats) for stats in token_logprobs(model, tokenizer, examples)])


def qa_drop(adapted: np.ndarray, base: np.ndarray) -> float:
    """The layer's score: how much the adapter lowers the correct answers' mean log-likelihood (positive: worse)."""
    if adapted.shape != base.shape or adapted.size == 0:
        raise ValueError(f"{adapted.size} adapted scores for {base.size} base scores.")
    return float(np.mean(base - adapted))
