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
