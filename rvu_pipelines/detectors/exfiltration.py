"""Recovery's default contamination signal: regexes for prompt-injection and exfiltration phrases.

Binary (1.0 on any match, else 0.0) and deliberately simple: it is the signal seed 000's recovery used.
Certificates record it as ``heuristic`` version ``1``, the name and version it had inside the recovery
pipeline, so E2/E3/E8 and every certificate written so far stay byte-identical. It is not D1
(:class:`~rvu_pipelines.detectors.heuristic.HeuristicDetector`: weighted pattern groups, seed 002);
recovery takes any :class:`InjectionDetector`, D1 included.
"""

from __future__ import annotations

import re

import numpy as np

from rvu_pipelines.detectors.base import DetectorBase
from rvu_pipelines.detectors.catalog import detector_plugin


class ExfiltrationHeuristic(DetectorBase):
    """1.0 when a text asks to ignore instructions, exfiltrate, override the system or send secrets out."""

    name = "heuristic"
    version = "1"
    PATTERNS: tuple[str, ...] = (
        r"\bignore\s+(?:all\s+|any\s+|the\s+)?(?:previous\s+|prior\s+|above\s+|earlier\s+)?instructions\b",
        r"\bdisregard\s+(?:all\s+|any\s+|the\s+)?(?:previous\s+|prior\s+|above\s+)?(?:instructions|rules)\b",
        r"\bexfiltrat\w*",
        r"\bsystem\s*:\s*(?:override|ignore|you are now|new instructions)",
        r"\boverride mode\b",
        r"\b(?:send|forward|post|upload|transfer|leak)\b[^.\n]{0,80}"
        r"\b(?:credentials?|passwords?|api[ _-]?keys?|secrets?|tokens?)\b",
        r"\b(?:curl|wget)\b[^\n]{0,120}https?://",
    )

    def __init__(self) -> None:
        self._regex = re.compile("|".join(f"(?:{pattern})" for pattern in self.PATTERNS), re.IGNORECASE)

    def _score(self, texts: list[str]) -> np.ndarray:
        return np.array([1.0 if self._regex.search(text) else 0.0 for text in texts], dtype=np.float64)


@detector_plugin("exfiltration", summary="recovery's exfiltration patterns (credentials, outbound URLs), no model")
def _load_exfiltration(argument: str, tracking_uri: str | None) -> tuple[ExfiltrationHeuristic, str]:
    exfiltration = ExfiltrationHeuristic()
    return exfiltration, f"exfiltration:{getattr(exfiltration, 'version', exfiltration.name)}"
