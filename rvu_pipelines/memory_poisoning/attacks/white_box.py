"""White-box access to the memory's sentence encoder: token ids in, the exact unit embeddings out, with gradients.

AgentPoison's trigger search and the adaptive HotFlip attack need what a black-box ``encode`` hides: the
tokenizer, the word-embedding table and a forward pass that accepts input embeddings so the loss can be
differentiated with respect to one token position (HotFlip, Ebrahimi et al. 2018). ``WhiteBoxEncoder``
wraps the SentenceTransformer inside ``SentenceEmbedder`` (Transformer -> Pooling -> Normalize, as
all-MiniLM-L6-v2 ships) and reproduces its ``encode`` exactly (same special tokens, padding, pooling and
normalisation; checked in the tests), so what the optimiser sees is what the memory indexes.

Triggers and edits are restricted to *whole-word* vocabulary entries (lower-case ASCII letters, no ``##``
continuation pieces): joined by spaces they re-tokenise to the same ids, so the optimised token sequence
and the string the victim types are the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

from rvu_pipelines.errors import MemoryPoisoningInputError

EMBED_BATCH = 256


class WhiteBoxEncoder:
    """Token-level access to a SentenceTransformer-backed embedder (``SentenceEmbedder``)."""

    def __init__(self, embedder: Any) -> None:

        model = getattr(embedder, "_model", None)
        modules = list(model) if model is not None and hasattr(model, "__iter__") else []
        first = modules[0] if modules else None
        auto_model = getattr(first, "auto_model", None)
        tokenizer = getattr(first, "tokenizer", None)
        if auto_model is None or tokenizer is None or not hasattr(auto_model, "get_input_embeddings"):
            raise MemoryPoisoningInputError(
                f"the embedder {getattr(embedder, 'name', type(embedder).__name__)!r} gives no white-box access "
                "(expected a SentenceEmbedder wrapping a SentenceTransformer whose first module has a tokenizer "
                "and a transformer with input embeddings); the white-box attacks (AgentPoison, adaptive HotFlip) "
                "need it: pass rvu_pipelines.models.embedder.SentenceEmbedder"
            )
        self.embedder = embedder
        self.model = model
        self.transformer = auto_model
        self.tokenizer = tokenizer
        self.tail = modules[1:]  # pooling, normalize
        self.max_length = int(getattr(model, "max_seq_length", 256) or 256)
        self.word_embeddings: torch.Tensor = auto_model.get_input_embeddings().weight.detach()
        self.cls_id = int(tokenizer.cls_token_id)
        self.sep_id = int(tokenizer.sep_token_id)
        self.pad_id = int(tokenizer.pad_token_id or 0)
        vocab = tokenizer.get_vocab()
        self._id_to_token = {int(i): t for t, i in vocab.items()}
        words = sorted(i for t, i in vocab.items() if t.isascii() and t.isalpha() and t.islower() and len(t) >= 2)
        self.word_ids = np.asarray(words, dtype=np.int64)
        if self.word_ids.size == 0:
            raise MemoryPoisoningInputError("the embedder's vocabulary has no whole-word tokens to build triggers from")
        self.transformer.eval()

    # --- text <-> ids -------------------------------------------------------------------------------------

    def token_ids(self, text: str) -> list[int]:
        """The word-piece ids of ``text`` without [CLS]/[SEP]."""
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._id_to_token[int(i)] for i in ids]

    def words(self, ids: Sequence[int]) -> str:
        """Whole-word ids joined by spaces (re-tokenises to the same ids)."""
        return " ".join(self.tokens(ids))

    # --- forward passes -----------------------------------------------------------------------------------

    def _batch(self, sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        body = self.max_length - 2
        rows = [[self.cls_id, *list(s)[:body], self.sep_id] for s in sequences]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return ids, mask

    def _pool(self, inputs_embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        import torch

        out = self.transformer(inputs_embeds=inputs_embeds, attention_mask=mask, token_type_ids=torch.zeros_like(mask))
        features: dict[str, torch.Tensor] = {"token_embeddings": out.last_hidden_state, "attention_mask": mask}
        for module in self.tail:
            features = module(features)
        return features["sentence_embedding"]

    def embed_ids(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """Unit embeddings of token sequences (no specials), exactly as ``encode`` on their text."""
        import torch

        if not sequences:
            return np.zeros((0, self.dimension), dtype=np.float32)
        chunks = []
        with torch.no_grad():
            for start in range(0, len(sequences), EMBED_BATCH):
                ids, mask = self._batch(sequences[start : start + EMBED_BATCH])
                chunks.append(self._pool(self.transformer.get_input_embeddings()(ids), mask).numpy())
        return np.concatenate(chunks).astype(np.float32)

    @property
    def dimension(self) -> int:
        return int(self.embedder.dimension)

    def gradients(
        self,
        sequences: Sequence[Sequence[int]],
        loss_fn: Callable[[torch.Tensor], torch.Tensor],
        *,
        inputs_delta: dict[int, torch.Tensor] | None = None,
    ) -> tuple[float, torch.Tensor]:
        """(loss, d loss / d input embeddings) for ``loss_fn(embeddings)``; the gradient has shape
        (n, len + 2, hidden) with [CLS] at position 0. ``inputs_delta`` adds a continuous perturbation to
        the input embedding of body positions (the relaxed attack's variable), all rows alike."""
        import torch

        ids, mask = self._batch(sequences)
        base = self.transformer.get_input_embeddings()(ids).detach()
        inputs = base.clone().requires_grad_(True)
        embeds = inputs
        if inputs_delta:
            add = torch.zeros_like(base)
            for position, delta in inputs_delta.items():
                add[:, position + 1] = delta
            embeds = inputs + add
        loss = loss_fn(self._pool(embeds, mask))
        (grad,) = torch.autograd.grad(loss, inputs)
        return float(loss.detach()), grad

    def embed_relaxed(self, sequence: Sequence[int], delta: dict[int, torch.Tensor]) -> np.ndarray:
        """The unit embedding of one token sequence with ``delta`` added to body positions' input embeddings."""
        import torch

        ids, mask = self._batch([sequence])
        with torch.no_grad():
            embeds = self.transformer.get_input_embeddings()(ids).clone()
            for position, d in delta.items():
                embeds[0, position + 1] += d
            return self._pool(embeds, mask).numpy()

    def hotflip(self, gradient: torch.Tensor, k: int, *, exclude: Sequence[int] = ()) -> list[int]:
        """The ``k`` whole-word tokens whose swap-in most decreases the loss to first order (HotFlip):
        argmin over v of e_v . gradient, over the whole-word vocabulary."""
        import torch

        table = self.word_embeddings[torch.from_numpy(self.word_ids)]
        scores = table @ gradient.detach()
        if exclude:
            drop = np.isin(self.word_ids, np.asarray(list(exclude), dtype=np.int64))
            scores[torch.from_numpy(drop)] = float("inf")
        order = torch.argsort(scores, stable=True)[:k]
        return [int(self.word_ids[i]) for i in order.tolist()]

    def nearest_words(self, vector: torch.Tensor, k: int) -> list[int]:
        """Whole-word tokens whose input embedding is nearest (L2) to ``vector`` (projection after a
        continuous relaxation)."""
        import torch

        table = self.word_embeddings[torch.from_numpy(self.word_ids)]
        distances = torch.linalg.vector_norm(table - vector.detach(), dim=1)
        order = torch.argsort(distances, stable=True)[:k]
        return [int(self.word_ids[i]) for i in order.tolist()]


def white_box(embedder: Any) -> WhiteBoxEncoder:
    """``embedder``'s white-box view, or a :class:`MemoryPoisoningInputError` that says what is needed."""
    if isinstance(embedder, WhiteBoxEncoder):
        return embedder
    return WhiteBoxEncoder(embedder)
