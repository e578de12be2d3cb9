"""D2 and D4 registered in MLflow (session tracking store) and loaded back by name: same scores, alias
'current' follows the newest version, D4 also loads as a plain mlflow.pyfunc model, no pickle involved."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from rvu_pipelines.detectors import (
    FinetunedDetector,
    TfidfDetector,
    load_registered_detector,
    register_detector,
    registered_name,
)
from rvu_pipelines.detectors.registry import resolve_version
from rvu_pipelines.errors import RegisteredDetectorError
from rvu_pipelines.tracking import MlflowTracker

EXPERIMENT = "detectors-registry-test"


@pytest.fixture(scope="module")
def tracker() -> MlflowTracker:
    return MlflowTracker(experiment=EXPERIMENT)  # the session's isolated sqlite store (tests/conftest.py)


@pytest.fixture(scope="module")
def registered(tracker, tiny_d2, tiny_d4):
    out = {}
    for kind, detector in (("d2", tiny_d2), ("d4", tiny_d4[0])):
        with tracker.run(f"register-{kind}") as run:
            out[kind] = register_detector(
                detector,
                name=registered_name(kind, "registry-test"),
                run_id=run.run_id,
                tracking_uri=tracker.tracking_uri,
                tags={"corpus": "deepset"},
            )
    return out


def test_registered_detectors_load_by_name_with_the_same_scores(registered, tracker, tiny_d2, tiny_d4, deepset) -> None:
    probe = deepset.texts("test")[:24]
    d2 = load_registered_detector("rvu-detector-d2-registry-test", tracker.tracking_uri)
    d4 = load_registered_detector("rvu-detector-d4-registry-test", tracker.tracking_uri)
    assert isinstance(d2, TfidfDetector) and isinstance(d4, FinetunedDetector)
    assert np.array_equal(d2.score(probe), tiny_d2.score(probe))
    assert np.array_equal(d4.score(probe), tiny_d4[0].score(probe))
    assert d4.registered.version == registered["d4"].version and d4.registered.kind == "d4"


def test_logged_models_use_no_pickle(registered, tracker, tmp_path) -> None:
    import mlflow.artifacts

    for kind, flavor in (("d2", "sklearn"), ("d4", "python_function")):
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"runs:/{registered[kind].run_id}/model",
                dst_path=str(tmp_path / kind),
                tracking_uri=tracker.tracking_uri,
            )
        )
        spec = yaml.safe_load((local / "MLmodel").read_text())
        assert flavor in spec["flavors"]
        assert not [p.name for p in local.rglob("*") if p.suffix in (".pkl", ".pickle")]
    assert spec["flavors"]["python_function"].get("model_code_path")  # D4: a model from code + safetensors


def test_d4_loads_as_a_standard_pyfunc_model(registered, tracker, tiny_d4, deepset) -> None:
    import mlflow.pyfunc
    import pandas as pd

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracker.tracking_uri)
    try:
        model = mlflow.pyfunc.load_model(f"models:/{registered['d4'].name}@current")
    finally:
        mlflow.set_tracking_uri(previous)
    probe = deepset.texts("test")[:6]
    assert np.allclose(np.asarray(model.predict(pd.DataFrame({"text": probe}))), tiny_d4[0].score(probe))


def test_alias_current_follows_the_newest_version(registered, tracker, tiny_d2) -> None:
    name = registered["d2"].name
    with tracker.run("register-d2-again") as run:
        newer = register_detector(tiny_d2, name=name, run_id=run.run_id, tracking_uri=tracker.tracking_uri)
    assert int(newer.version) == int(registered["d2"].version) + 1
    assert resolve_version(name, tracker.tracking_uri).version == newer.version
    assert resolve_version(name, tracker.tracking_uri, registered["d2"].version).version == registered["d2"].version


def test_unknown_names_are_clear_errors(tracker) -> None:
    with pytest.raises(RegisteredDetectorError, match="Materialize the detector assets"):
        load_registered_detector("rvu-detector-d4-nowhere", tracker.tracking_uri)
    with pytest.raises(RegisteredDetectorError, match="Allowed values: d2, d4"):
        registered_name("d9", "deepset")
    with pytest.raises(RegisteredDetectorError, match=r"registered: TfidfDetector \(d2\), FinetunedDetector \(d4\)"):
        from rvu_pipelines.detectors import HeuristicDetector

        register_detector(HeuristicDetector(), name="x", run_id="r", tracking_uri=tracker.tracking_uri)
