"""A write-time memory-poisoning detector as the reference monitor's enforced content check.

``ReferenceMonitor(write_check=DetectorWriteCheck(detector, embedder))`` embeds every value a write
would commit, scores it with the fitted detector (MEMSAD, the hybrid, a composite) and rejects it
under Rule.WRITE_CHECK when the detector flags it; the score lands in the audit record.
"""

from __future__ import annotations

import numpy as np

from rvu_pipelines.memory.user_channel import ContentVerdict
from rvu_pipelines.memory_poisoning.defenses.base import WriteDetector
from rvu_pipelines.memory_poisoning.retrieval import Embedder, embed_texts


class DetectorWriteCheck:
    """Adapts a fitted ``WriteDetector`` + its embedder to the monitor's ``ContentCheck`` protocol."""

    def __init__(self, detector: WriteDetector, embedder: Embedder, name: str | None = None) -> None:
        self.detector = detector
        self.embedder = embedder
        self.name = name or f"write-check:{detector.name}"

    def check(self, text: str) -> ContentVerdict:
        vectors = embed_texts(self.embedder, [text], "memory write")
        score = float(np.asarray(self.detector.score(vectors, [text]))[0])
        flagged = bool(np.asarray(self.detector.flags(vectors, [text]))[0])
        return ContentVerdict(self.name, score, flagged, ("above_threshold",) if flagged else ())
