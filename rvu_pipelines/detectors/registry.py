"""D2 and D4 as registered MLflow models, so any evaluation, the recovery pipeline or the attack
harness can load "the current detector" by name. How each type is stored is declared by its own module
(:mod:`rvu_pipelines.detectors.registry_formats`):

* D2 is logged with the ``mlflow.sklearn`` flavour in skops format (no pickle).
* D4 is logged as an ``mlflow.pyfunc`` model from code (``mlflow_d4_model.py``) wrapping the
  safetensors weights, so MLflow never cloudpickles a Python object.
* D4 on ONNX Runtime (``onnx_d4.OnnxDetector``) is another version of the same registered model, a pyfunc
  from code (``mlflow_d4_onnx_model.py``) over the exported graphs, requiring onnxruntime instead of torch.

Each registration creates a new model version and points an alias at it: ``current`` (the float PyTorch
reference, which evaluations load) unless told otherwise, e.g. ``onnx`` for the fast runtime.
:func:`load_registered_detector` reads the files itself and rebuilds an :class:`InjectionDetector`
(skops with no extra trusted types, safetensors), so loading never unpickles and does not need
MLflow's ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION`` switch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rvu_pipelines.detectors.base import DetectorBase
from rvu_pipelines.detectors.catalog import detector_plugin
from rvu_pipelines.detectors.registry_formats import (
    KIND_KEY,
    NAME_KEY,
    format_for_detector,
    format_for_tag,
    formats,
)
from rvu_pipelines.errors import ConfigError, RegisteredDetectorError
from rvu_pipelines.paths import default_tracking_uri

CURRENT_ALIAS = "current"
ONNX_ALIAS = "onnx"
MODEL_ARTIFACT = "model"


def registered_name(kind: str, corpus: str) -> str:
    """The registry name of a detector kind (d2 | d4) trained on a corpus, e.g. rvu-detector-d4-deepset."""
    if kind not in ("d2", "d4"):  # d4_onnx is a version of the d4 model, not a name of its own
        raise RegisteredDetectorError(f"Unknown registered detector kind '{kind}'. Allowed values: d2, d4")
    return f"rvu-detector-{kind}-{corpus}"


@dataclass(frozen=True)
class RegisteredDetector:
    """Where a registered detector lives: registry name and version, the run that logged it."""

    name: str
    version: str
    run_id: str
    kind: str
    tracking_uri: str

    @property
    def model_uri(self) -> str:
        return f"models:/{self.name}/{self.version}"

    def record(self) -> dict[str, str]:
        return {
            "registered_name": self.name,
            "version": self.version,
            "run_id": self.run_id,
            "kind": self.kind,
            "model_uri": self.model_uri,
            "tracking_uri": self.tracking_uri,
        }


def _client(tracking_uri: str) -> Any:  # MlflowClient, imported lazily (mlflow is slow to import)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def register_detector(
    detector: DetectorBase,
    *,
    name: str,
    run_id: str,
    tracking_uri: str | None = None,
    tags: Mapping[str, object] | None = None,
    description: str = "",
    alias: str = CURRENT_ALIAS,
) -> RegisteredDetector:
    """Log the detector as the ``model`` artifact of ``run_id`` (``artifact``), register a new version, point
    ``alias`` at it (``current`` by default; the ONNX runtime goes in as ``onnx``)."""
    from mlflow.exceptions import MlflowException

    uri = tracking_uri or default_tracking_uri()
    client = _client(uri)
    str_tags = {k: str(v) for k, v in sorted((tags or {}).items())}
    artifact = MODEL_ARTIFACT if alias == CURRENT_ALIAS else f"{MODEL_ARTIFACT}_{alias}"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / MODEL_ARTIFACT
        stored = format_for_detector(detector)
        stored.save(detector, folder)
        kind = stored.kind
        client.log_artifacts(run_id, str(folder), artifact)
    try:
        client.create_registered_model(name, description=description or None)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version = client.create_model_version(
        name,
        f"runs:/{run_id}/{artifact}",
        run_id=run_id,
        tags={KIND_KEY: stored.tag, **str_tags},
        description=description or None,
    )
    client.set_registered_model_alias(name, alias, version.version)
    return RegisteredDetector(name, str(version.version), run_id, kind, uri)


def resolve_version(
    name: str, tracking_uri: str | None = None, version: str | int | None = None, alias: str = CURRENT_ALIAS
) -> RegisteredDetector:
    """The version named (default: the one ``alias`` points at) with the run that logged it."""
    from mlflow.exceptions import MlflowException

    uri = tracking_uri or default_tracking_uri()
    client = _client(uri)
    try:
        found = (
            client.get_model_version(name, str(version))
            if version is not None
            else client.get_model_version_by_alias(name, alias)
        )
    except MlflowException as exc:
        which = f"version {version}" if version is not None else f"alias '{alias}'"
        raise RegisteredDetectorError(
            f"No registered detector '{name}' ({which}) in the MLflow registry at {uri}. Materialize the detector "
            "assets (group 'detectors') or register one with register_detector()."
        ) from exc
    kind = next((f.kind for f in formats() if f.tag == found.tags.get(KIND_KEY)), "")
    return RegisteredDetector(name, str(found.version), str(found.run_id or ""), kind, uri)


def reinstate_versions(name: str, tracking_uri: str, versions: dict[str, str]) -> bool:
    """Point each alias (``{"current": "3", "onnx": "4"}``) at its version again, as the run that registered
    them left it; False, changing nothing, when any of those versions is gone from the registry."""
    try:
        for version in versions.values():
            resolve_version(name, tracking_uri, version=version)
    except RegisteredDetectorError:
        return False
    client = _client(tracking_uri)
    for alias, version in versions.items():
        client.set_registered_model_alias(name, alias, version)
    return True


def registered_ref(detector: DetectorBase) -> RegisteredDetector:
    """Where a detector from :func:`load_registered_detector` was loaded from (its ``registered`` attribute)."""
    ref = getattr(detector, "registered", None)
    if not isinstance(ref, RegisteredDetector):
        raise RegisteredDetectorError(f"{detector.name} was not loaded from the MLflow registry.")
    return ref


def load_registered_detector(
    name: str, tracking_uri: str | None = None, version: str | int | None = None, alias: str = CURRENT_ALIAS
) -> DetectorBase:
    """The registered detector ``name`` (``alias``, default ``current``, unless ``version``) as an
    InjectionDetector; an ONNX Runtime version (alias ``onnx``) comes back as an ``OnnxDetector``."""
    import mlflow.artifacts

    ref = resolve_version(name, tracking_uri, version, alias)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            source = _client(ref.tracking_uri).get_model_version_download_uri(ref.name, ref.version)
            local = Path(
                mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=tmp, tracking_uri=ref.tracking_uri)
            )
        except Exception as exc:
            raise RegisteredDetectorError(
                f"The files of {ref.model_uri} could not be downloaded from "
                f"{ref.tracking_uri}: {type(exc).__name__}: {exc}"
            ) from exc
        mlmodel = local / "MLmodel"
        if not mlmodel.is_file():
            raise RegisteredDetectorError(f"{ref.model_uri} has no MLmodel file; it is not a logged detector.")
        spec = yaml.safe_load(mlmodel.read_text()) or {}
        stored = format_for_tag((spec.get("metadata") or {}).get(KIND_KEY), ref.model_uri)
        detector = stored.load(local, spec)
    detector.name = str((spec.get("metadata") or {}).get(NAME_KEY) or detector.name)
    detector.registered = ref  # type: ignore[attr-defined]  # read back by registered_ref()
    detector.version = f"{ref.name}/{ref.version}"  # type: ignore[attr-defined]  # the certificate's detector version
    return detector


@detector_plugin(
    "registered",
    parameter="<name>[@<alias>]",
    summary="any D2 / D4 registered in the MLflow registry (alias 'current' by default)",
)
def _load_registered(argument: str, tracking_uri: str | None) -> tuple[DetectorBase, str]:
    name, _, alias = argument.partition("@")
    alias = alias or CURRENT_ALIAS
    if not name:
        raise ConfigError(
            f"Invalid detector 'registered:{argument}': name the registered model, e.g. registered:<name>."
        )
    detector = load_registered_detector(name, tracking_uri, alias=alias)
    ref = registered_ref(detector)
    return detector, f"registered:{ref.name}@{alias}={ref.version}"
