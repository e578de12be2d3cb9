"""The one interface every write-time memory-poisoning detector implements.

A detector is fitted on what a defender has before any attack: the benign reference entries
(embeddings and texts) and the rolling history of queries the agent has served. It then scores a
candidate entry *before* it is written; higher means more anomalous, and ``flags`` applies the
detector's own calibrated threshold. The study, the reference monitor's content check and the
incident replay all call this interface, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class WriteContext:
    """What the defender knows when it calibrates: benign reference entries and the query history."""

    reference_vectors: np.ndarray  # (n_ref, d) unit rows: benign entries never in the test
    reference_texts: tuple[str, ...]
    history_vectors: np.ndarray  # (n_hist, d) unit rows: queries the agent served (victim-query history)
    history_texts: tuple[str, ...] = ()
    memory_vectors: np.ndarray | None = None  # the current memory, for detectors that need it (kNN)
    memory_texts: tuple[str, ...] = ()


class WriteDetector(Protocol):
    """Scores candidate memory entries at write time; higher = more anomalous."""

    name: str

    @property
    def threshold(self) -> float: ...

    def fit(self, context: WriteContext) -> WriteDetector: ...

    def score(self, vectors: np.ndarray, texts: Sequence[str]) -> np.ndarray: ...

    def flags(self, vectors: np.ndarray, texts: Sequence[str]) -> np.ndarray: ...
