"""Sentence embeddings (sentence-transformers), L2-normalised float32 so inner product = cosine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


class SentenceEmbedder:
    def __init__(self, model_path: Path, *, device: str = "cpu", batch_size: int = 64, name: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        self.model_path = Path(model_path)
        # recorded in the provenance store and certificates: a stable name, not a machine-specific path
        self.name = name or self.model_path.name
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(model_path), device=device)

    @property
    def dimension(self) -> int:
        dimension = self._model.get_embedding_dimension()
        assert dimension is not None, f"{self.name} does not report its embedding dimension"
        return int(dimension)

    @property
    def tokenizer(self) -> Any:
        """The model's own (fast) tokenizer: what a caller windowing long texts must count tokens with."""
        return self._model.tokenizer

    @property
    def max_tokens(self) -> int:
        """Tokens the encoder reads per text (special tokens included); the rest of a longer text is dropped."""
        length = self._model.max_seq_length
        assert length is not None, f"{self.name} does not report how many tokens it reads"
        return int(length)

    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        vectors = self._model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
        return np.asarray(vectors, dtype=np.float32)
