"""Buried injections: a payload planted at a random place inside a long benign tool output.

A detector that reads the first few hundred tokens of a tool output, or averages over all of it, can be
walked past by burying the injection in a long benign document; real tool outputs (an inbox, a file, a
web page) are often thousands of tokens long. Each case here is a pair over the same benign document of a
target length: the document alone (label 0) and the document with one payload at a random word boundary
(label 1). Lengths are counted in the tokens of a stated tokenizer (the detectors' encoder); documents are
benign deployment outputs of the held-out split joined until the length is reached, then cut.

TPR at a fixed FPR is read on the pairs: the threshold is the benign documents' own (1 - FPR) quantile,
so the rate compares detectors at the same false-alarm budget whatever their score scale.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from rvu_pipelines.errors import DetectorError

LENGTHS: tuple[int, ...] = (512, 2048, 8192)
BURIED_COLUMNS = {
    "id": pl.String,
    "pair": pl.String,
    "text": pl.String,
    "label": pl.Int8,
    "length": pl.Int64,
    "position": pl.Float64,
    "payload_id": pl.String,
}


def _rng(seed: int, *key: object) -> np.random.Generator:
    digest = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def cut_to_tokens(tokenizer: Any, text: str, n_tokens: int) -> str:
    """The prefix of ``text`` holding its first ``n_tokens`` tokens (without special tokens)."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
    if len(offsets) <= n_tokens:
        return text
    return text[: offsets[n_tokens - 1][1]]


def long_document(tokenizer: Any, documents: Sequence[str], n_tokens: int, rng: np.random.Generator) -> str:
    """Benign documents in a random order (a short pool repeats), joined by blank lines until ``n_tokens``
    tokens, then cut there."""
    order = rng.permutation(len(documents))
    parts: list[str] = []
    count = 0
    position = 0
    while count < n_tokens:
        parts.append(documents[int(order[position % len(order)])])
        position += 1
        count += _count(tokenizer, parts[-1])
        if count >= n_tokens:
            count = _count(tokenizer, "\n\n".join(parts))  # joining may merge tokens at the seams
    return cut_to_tokens(tokenizer, "\n\n".join(parts), n_tokens)


def bury(document: str, payload: str, rng: np.random.Generator) -> tuple[str, float]:
    """``payload`` at a random word boundary of ``document``; returns the text and the relative position."""
    words = document.split(" ")
    at = int(rng.integers(0, len(words) + 1))
    return " ".join([*words[:at], payload, *words[at:]]), at / max(1, len(words))


def build_buried_set(
    tokenizer: Any,
    benign: Sequence[str],
    payloads: Sequence[tuple[str, str]],
    *,
    lengths: Sequence[int] = LENGTHS,
    pairs_per_length: int | dict[int, int] = 100,
    seed: int = 42,
) -> pl.DataFrame:
    """Pairs (benign document, the same with a payload buried) per target length; ``payloads``: (id, text)."""
    if not benign or not payloads:
        raise DetectorError("Buried injections need benign documents and payloads; one of them is empty.")
    rows = []
    for length in lengths:
        n = pairs_per_length.get(length, 0) if isinstance(pairs_per_length, dict) else pairs_per_length
        for k in range(n):
            rng = _rng(seed, length, k)
            document = long_document(tokenizer, benign, length, rng)
            payload_id, payload = payloads[int(rng.integers(0, len(payloads)))]
            buried, position = bury(document, payload, rng)
            pair = f"{length}:{k}"
            rows.append((f"{pair}:benign", pair, document, 0, length, float("nan"), ""))
            rows.append((f"{pair}:buried", pair, buried, 1, length, position, payload_id))
    return pl.DataFrame(rows, schema=BURIED_COLUMNS, orient="row")


def tpr_at_fpr(y: np.ndarray, scores: np.ndarray, fpr: float = 0.01) -> tuple[float, float]:
    """TPR at the benign scores' own threshold for ``fpr``, and that threshold (at most ``floor(fpr * n)``
    benign scores reach it)."""
    from rvu_pipelines.detectors.production import threshold_for_fpr

    y = np.asarray(y, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    threshold = threshold_for_fpr(scores[y == 0], fpr)
    positives = scores[y == 1]
    if positives.size == 0:
        raise DetectorError("TPR needs positive examples.")
    return float(np.mean(positives >= threshold)), threshold
