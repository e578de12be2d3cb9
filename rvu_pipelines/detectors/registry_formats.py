"""How a detector type is stored as an MLflow model, declared by the detector's own module.

Each registrable detector type declares one :class:`RegistryFormat` (:func:`register_format`): the kind tag its
MLmodel metadata carries, a ``save`` that writes the MLflow model folder and a ``load`` that rebuilds the
detector from a downloaded folder (never by unpickling). :mod:`rvu_pipelines.detectors.registry` logs,
registers and loads through these, so registering a new kind of detector touches only its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.detectors.base import DetectorBase
from rvu_pipelines.errors import RegisteredDetectorError

KIND_KEY = "rvu_detector"  # MLmodel metadata: which format wrote the folder
NAME_KEY = "rvu_detector_name"  # the detector's display name, restored on load


@dataclass(frozen=True)
class RegistryFormat:
    """One stored form: ``kind`` (d2, d4, d4_onnx: the short name), ``tag`` (the metadata value), the detector
    type it saves, ``save(detector, folder)`` and ``load(folder, mlmodel) -> detector``."""

    kind: str
    tag: str
    detector_type: type
    save: Callable[[Any, Path], None]
    load: Callable[[Path, dict], DetectorBase]
    accepts: Callable[[Any], bool] = lambda detector: True  # e.g. an ONNX detector needs its exported folder


_FORMATS: dict[str, RegistryFormat] = {}


def register_format(stored: RegistryFormat) -> RegistryFormat:
    """Declare a stored form; a second one with the same kind from another type is refused."""
    existing = _FORMATS.get(stored.kind)
    if existing is not None and existing.detector_type is not stored.detector_type:
        raise RegisteredDetectorError(
            f"Two registry formats are named '{stored.kind}': {existing.detector_type} and {stored.detector_type}."
        )
    _FORMATS[stored.kind] = stored
    return stored


def formats() -> tuple[RegistryFormat, ...]:
    """Every declared form (each registrable detector module imported), sorted by kind."""
    from rvu_pipelines.detectors.catalog import import_detector_modules

    import_detector_modules()
    return tuple(_FORMATS[kind] for kind in sorted(_FORMATS))


def format_for_detector(detector: DetectorBase) -> RegistryFormat:
    """The form ``detector`` is stored in, or a clear error naming the types that can be registered."""
    found = [f for f in formats() if isinstance(detector, f.detector_type) and f.accepts(detector)]
    if not found:
        allowed = ", ".join(f"{f.detector_type.__name__} ({f.kind})" for f in formats())
        raise RegisteredDetectorError(
            f"Only these detectors are registered: {allowed}; got {type(detector).__name__} "
            "(an ONNX Runtime detector must be loaded from an exported folder)."
        )
    return found[0]


def format_for_tag(tag: object, model_uri: str) -> RegistryFormat:
    """The form a downloaded MLmodel's metadata names, or a clear error."""
    for stored in formats():
        if stored.tag == tag:
            return stored
    raise RegisteredDetectorError(
        f"{model_uri} is not an RVU detector (metadata {KIND_KEY}={tag!r}); "
        f"expected one of {sorted(f.tag for f in formats())}."
    )


def pinned_requirements(*names: str) -> list[str]:
    """``name==version`` of each installed package, for the logged model's requirements."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in names]
