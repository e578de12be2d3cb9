"""What the platform asks of a text embedder, said once: memory retrieval, recovery's vector index and adapter
influence all take an :class:`Embedder`; :class:`rvu_pipelines.models.embedder.SentenceEmbedder` (MiniLM) is
the real one, :class:`HashingEmbedder` the dependency-free one for offline runs and small tests."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """Texts in, one L2-normalised float32 row per text out; ``name`` is recorded beside stored vectors."""

    name: str

    @property
    def dimension(self) -> int: ...

    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray: ...


class HashingEmbedder:
    """A dependency-free, deterministic embedder: signed feature hashing of lower-cased word tokens.

    Good enough to give every entry a retrievable vector in tests and offline runs; swap in the
    MiniLM ``SentenceEmbedder`` for semantic retrieval.
    """

    _TOKEN = re.compile(r"[a-z0-9]+")

    def __init__(self, dimension: int = 64) -> None:
        self._dimension = dimension
        self.name = f"hashing-{dimension}-v1"

    @property
    def dimension(self) -> int:
        return self._dimension

    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self._dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in self._TOKEN.findall(text.lower()):
                digest = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little")
                out[row, digest % self._dimension] += 1.0 if (digest >> 63) & 1 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)


def embedder_name(embedder: Any) -> str:
    """The name recorded beside vectors: the embedder's own, else its class and model path."""
    name = getattr(embedder, "name", None)
    if name:
        return str(name)
    path = getattr(embedder, "model_path", None)
    return f"{type(embedder).__name__}:{path}" if path else type(embedder).__name__


class RememberingEmbedder:
    """An embedder that embeds each distinct text once and answers repeats from memory (at most ``max_texts``
    texts, the oldest forgotten first).

    For callers that embed the same records again and again: a study's cells share their memories and queries,
    a test session its data sets. The texts not yet remembered are embedded together, distinct and sorted, so a
    text's vector does not depend on the order it was asked in. Not for timing an embedder: a repeat costs
    nothing. Everything but ``encode`` (the tokenizer, ``max_tokens``, the model path) is the wrapped embedder's.
    """

    def __init__(self, inner: Embedder, *, max_texts: int = 65_536) -> None:
        if max_texts < 1:
            raise ValueError(f"max_texts must be at least 1, got {max_texts}")
        self.inner = inner
        self.name = inner.name
        self.max_texts = max_texts
        self._vectors: dict[str, np.ndarray] = {}  # insertion order: the oldest first

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): never look for it on itself
            raise AttributeError(name)
        return getattr(self.inner, name)

    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        missing = sorted({text for text in texts if text not in self._vectors})
        if len(missing) > self.max_texts:
            return self.inner.encode(list(texts), show_progress=show_progress)  # more than it may keep at once
        if missing:
            vectors = self.inner.encode(missing, show_progress=show_progress)
            self._vectors.update(zip(missing, vectors, strict=True))
        if texts:
            out = np.stack([self._vectors[text] for text in texts])
        else:
            out = np.zeros((0, self.dimension), dtype=np.float32)
        excess = len(self._vectors) - self.max_texts
        if excess > 0:
            for old in list(self._vectors)[:excess]:
                del self._vectors[old]
        return out
