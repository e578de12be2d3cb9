"""The remembering embedder: each distinct text embedded once, the same vectors whatever the order, a bound kept."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.models.embedding import HashingEmbedder, RememberingEmbedder


class _Counting(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(32)
        self.calls: list[list[str]] = []
        self.tokenizer = "the inner tokenizer"

    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        self.calls.append(list(texts))
        return super().encode(texts)


def test_repeats_are_answered_from_memory_with_the_inner_vectors() -> None:
    inner = _Counting()
    remembering = RememberingEmbedder(inner)
    texts = ["b text", "a text", "b text"]
    first = remembering.encode(texts)
    assert inner.calls == [["a text", "b text"]]  # distinct and sorted: the order asked in changes nothing
    np.testing.assert_array_equal(first, HashingEmbedder(32).encode(texts))
    again = remembering.encode(["a text", "c text"])
    assert inner.calls[-1] == ["c text"]  # only what it has not seen
    np.testing.assert_array_equal(again[0], first[1])
    assert remembering.encode([]).shape == (0, 32) and len(inner.calls) == 2
    assert remembering.name == inner.name and remembering.dimension == 32
    assert remembering.tokenizer == "the inner tokenizer"  # everything but encode is the inner embedder's


def test_the_oldest_texts_are_forgotten_past_the_bound() -> None:
    inner = _Counting()
    remembering = RememberingEmbedder(inner, max_texts=2)
    remembering.encode(["one", "two"])
    remembering.encode(["three"])  # "one" is the oldest: forgotten
    remembering.encode(["two", "three"])
    assert inner.calls == [["one", "two"], ["three"]]
    remembering.encode(["one"])
    assert inner.calls[-1] == ["one"]
    many = remembering.encode(["x", "y", "z"])  # more than it may keep: embedded as asked, nothing kept
    assert inner.calls[-1] == ["x", "y", "z"] and many.shape == (3, 32)
    with pytest.raises(ValueError, match="max_texts"):
        RememberingEmbedder(inner, max_texts=0)
