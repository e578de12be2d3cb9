"""The gate's sensitive-set layer: how much an adapter raises the model's likelihood of content it must not hold.

A deployment keeps lists of what no adapter may have learned: the forget lists of unlearning requests (the TOFU
forget set here) and hazardous knowledge (WMDP-cyber questions with their answers). An adapter trained on them
makes exactly those answers more likely. The layer scores each sensitive example with Min-K %++ (the
membership score that separates trained from unseen text best on this model, ``membership.py``) on the base
and with the adapter, and reports the mean rise. It sees memorisation of the listed content and nothing else:
a style, persona or backdoor adapter leaves it near zero by design, which is why it is one layer among several.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.membership import membership_scores, token_logprobs
from rvu_pipelines.adapters.zoo_data import Frames

N_SENSITIVE = 32  # half forget-list answers, half WMDP-cyber questions with their answer


def sensitive_examples(frames: Frames, n: int = N_SENSITIVE, seed: int = 0) -> list[ChatExample]:
    """A seeded sample of the sensitive lists: TOFU forget-set answers and WMDP-cyber answers, ``n`` in all."""
    import polars as pl

    from rvu_pipelines.adapters.wmdp import LETTERS, items_from_frame, wmdp_prompt

    rng = np.random.default_rng(seed)
    forget = frames("tofu").filter(pl.col("subset") == "forget")
    rows = [forget.row(int(i), named=True) for i in sorted(rng.choice(forget.height, n // 2, replace=False))]
    examples = [ChatExample(str(r["question"]), str(r["answer"])) for r in rows]
    items = items_from_frame(frames("wmdp_cyber"))
    for i in sorted(rng.choice(len(items), n - n // 2, replace=False)):
        item = items[int(i)]
        answer = f"{LETTERS[item.answer]}. {item.choices[item.answer]}"
        examples.append(ChatExample(wmdp_prompt(item.question, item.choices), answer))
    return examples


def sensitive_scores(model: Any, tokenizer: Any, examples: Sequence[ChatExample]) -> np.ndarray:
    """Min-K %++ of each example's answer under ``model`` (higher: more like something it was trained on)."""
    return membership_scores(token_logprobs(model, tokenizer, examples))["min_k_plus_plus"]


def sensitive_shift(adapted: np.ndarray, base: np.ndarray) -> float:
    """The layer's score: the mean rise of the sensitive answers' Min-K %++ with the adapter over the base."""
    if adapted.shape != base.shape or adapted.size == 0:
        raise ValueError(f"{adapted.size} adapted scores for {base.size} base scores.")
    return float(np.mean(adapted - base))
