"""Per-token negative log-likelihood of memory entries under the local LLM (the hybrid's naturalness feature).

A synonym swap that keeps an embedding in place tends to pick words a language model finds unlikely in
context ("the trusted reply is forever the reverse of the data"). ``LlamaPerplexity`` scores a text as
its mean next-token NLL in nats under a GGUF model run by llama.cpp with ``logits_all`` (SmolLM2-135M in
this project): one forward pass over the tokens, log-softmax of each position's logits, the log-probability
of the token that follows. Texts are scored one sequence at a time (llama-cpp-python's high-level API has
one sequence per context; the cost is compute-bound either way) and the
results are cached by the SHA-256 of the text, so a reference set is scored once per process.

The model is loaded as the rest of the project loads llama.cpp (``open_llama`` with the project's runtime
settings), after the child-process probe (``ensure_llama_runs``) so a native crash fails with a reason
instead of killing the caller.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.machine import usable_cores
from rvu_pipelines.models.llama_runtime import LlamaRuntimeSettings, open_llama

DEFAULT_N_CTX = 512


class NllScorer(Protocol):
    """What the hybrid check needs: mean per-token NLL (nats) for each text."""

    name: str

    def nll(self, texts: Sequence[str]) -> np.ndarray: ...


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class LlamaPerplexity:
    """Mean next-token NLL under a GGUF model (llama.cpp, ``logits_all=True``), cached by text hash."""

    def __init__(
        self,
        model_path: Path | str,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        runtime: LlamaRuntimeSettings | None = None,
        name: str | None = None,
    ) -> None:
        from llama_cpp import Llama

        from rvu_pipelines.models.native_probe import ensure_llama_runs

        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise MemoryPoisoningInputError(f"perplexity: no GGUF model at {self.model_path}")
        self.name = name or self.model_path.name
        self.n_ctx = int(n_ctx)
        threads = n_threads or usable_cores()
        self.runtime = runtime or LlamaRuntimeSettings.configured()
        # the probe's verdict is remembered per (model, build, settings, threads): None = the default key
        ensure_llama_runs(self.model_path, settings=self.runtime, n_threads=n_threads)
        self._llm: Any = open_llama(
            Llama,
            self.model_path,
            self.runtime,
            n_ctx=self.n_ctx,
            n_threads=threads,
            logits_all=True,
            seed=0,
            verbose=False,
        )
        self._cache: dict[str, float] = {}
        self._lock = threading.Lock()  # a llama.cpp context is not thread-safe
        self.evaluated = 0  # texts actually run through the model (cache misses)

    def __len__(self) -> int:
        return len(self._cache)

    def nll(self, texts: Sequence[str]) -> np.ndarray:
        """Mean per-token NLL (nats) of each text; a text of one token or none is refused."""
        out = np.empty(len(texts))
        for i, text in enumerate(texts):
            key = text_key(text)
            cached = self._cache.get(key)
            if cached is None:
                cached = self._cache[key] = self._score(text)
            out[i] = cached
        return out

    def _score(self, text: str) -> float:
        with self._lock:
            tokens = self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[: self.n_ctx]
            if len(tokens) < 2:
                raise MemoryPoisoningInputError(f"perplexity: text {text[:40]!r} has fewer than 2 tokens")
            self._llm.reset()
            self._llm.eval(tokens)
            logits = np.asarray(self._llm.scores[: len(tokens) - 1], dtype=np.float64)
            self.evaluated += 1
        top = logits.max(axis=1)
        log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        log_probs = logits[np.arange(len(tokens) - 1), tokens[1:]] - log_norm
        return float(-log_probs.mean())
