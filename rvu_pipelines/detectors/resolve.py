"""One way to name a detector, for every place that lets a user pick one (the classifier defense, the memory
monitor's USER-channel check, recovery's contamination signal, the CLI and the asset configs).

Choices: ``production`` (``rvu-injection-detector`` at alias ``production`` in the MLflow registry: the
calibrated detector, 0.5 = 1 % FPR on benign tool outputs), ``nanoguard`` (D3, package-shipped weights),
``heuristic`` (D1's patterns), ``exfiltration`` (recovery's exfiltration heuristic) and
``registered:<name>`` or ``registered:<name>@<alias>`` (any registered D2/D4, alias ``current`` by default).
"""

from __future__ import annotations

from typing import Any

from rvu_pipelines.detectors.base import InjectionDetector
from rvu_pipelines.errors import ConfigError, RegisteredDetectorError

PRODUCTION_CHOICE = "production"
DETECTOR_CHOICES: tuple[str, ...] = (
    PRODUCTION_CHOICE,
    "nanoguard",
    "heuristic",
    "exfiltration",
    "registered:<name>[@<alias>]",
)


def resolve_detector(choice: str, tracking_uri: str | None = None) -> tuple[InjectionDetector, str]:
    """The detector ``choice`` names and a version string (for cache keys and certificates).

    ``tracking_uri``: the MLflow registry to read (the tracker resource's, resolved at the edge); None uses
    the platform default."""
    from rvu_pipelines.detectors.registry import CURRENT_ALIAS, load_registered_detector

    if choice == "heuristic":
        from rvu_pipelines.detectors.heuristic import HeuristicDetector

        heuristic = HeuristicDetector()
        return heuristic, f"heuristic:{heuristic.name}"
    if choice == "exfiltration":
        from rvu_pipelines.detectors.exfiltration import ExfiltrationHeuristic

        exfiltration = ExfiltrationHeuristic()
        return exfiltration, f"exfiltration:{getattr(exfiltration, 'version', exfiltration.name)}"
    if choice == "nanoguard":
        from rvu_pipelines.detectors.pretrained import load_pretrained_detector

        loaded = load_pretrained_detector("nanoguard")
        return loaded.detector, f"nanoguard:{loaded.record.get('sha256', loaded.record.get('model'))}"
    if choice == PRODUCTION_CHOICE or choice.startswith("registered:"):
        from rvu_pipelines.detectors.production import PRODUCTION_ALIAS, PRODUCTION_NAME

        if choice == PRODUCTION_CHOICE:
            name, alias = PRODUCTION_NAME, PRODUCTION_ALIAS
        else:
            name, _, alias = choice.split(":", 1)[1].partition("@")
            alias = alias or CURRENT_ALIAS
        if not name:
            raise ConfigError(f"Invalid detector '{choice}': name the registered model, e.g. registered:<name>.")
        try:
            detector = load_registered_detector(name, tracking_uri, alias=alias)
        except RegisteredDetectorError as exc:
            if choice != PRODUCTION_CHOICE:
                raise
            raise RegisteredDetectorError(
                f"{exc} The production detector is trained and registered by the asset 'detector_production' "
                "(part of `make run`'s default job); materialize it, or choose another detector "
                "(nanoguard, heuristic)."
            ) from exc
        ref = detector.registered  # type: ignore[attr-defined]
        return detector, f"registered:{ref.name}@{alias}={ref.version}"
    raise ConfigError(f"Invalid detector '{choice}'; allowed values: {', '.join(DETECTOR_CHOICES)}.")


def content_check_for(choice: str = PRODUCTION_CHOICE, tracking_uri: str | None = None, threshold: float = 0.5) -> Any:
    """The memory monitor's USER-channel content check backed by the detector ``choice`` names (default: the
    production detector), for ``UserChannel(content_check=...)``; flagged at ``threshold``."""
    from rvu_pipelines.memory.user_channel import ScoreContentCheck

    detector, version = resolve_detector(choice, tracking_uri)
    return ScoreContentCheck(version, lambda text: float(detector.score([text])[0]), threshold)
