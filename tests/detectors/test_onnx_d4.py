"""D4 on ONNX Runtime against the PyTorch reference: the float graph scores what PyTorch scores, int8 stays within
its stated tolerance, and a swapped or foreign graph file is refused before it is run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rvu_pipelines.detectors.onnx_d4 import ONNX_CONFIG, OnnxDetector, agreement, export_detector
from rvu_pipelines.errors import ChecksumMismatchError, DetectorError

INT8_MAX_ABS_DIFF = 0.05  # dynamic int8: activations quantised per call (stated in README's performance table)


@pytest.fixture(scope="module")
def exported(tiny_d4, tmp_path_factory) -> Path:
    detector, _ = tiny_d4
    return export_detector(detector, tmp_path_factory.mktemp("onnx_d4"))


@pytest.fixture(scope="module")
def test_texts(deepset) -> tuple[list[str], np.ndarray]:
    return deepset.texts("test"), deepset.labels("test")


def test_the_float_graph_scores_what_pytorch_scores(tiny_d4, exported, encoder, test_texts) -> None:
    detector, _ = tiny_d4
    texts, labels = test_texts
    reference = detector.score(texts)
    onnx = OnnxDetector.load(exported, "float", encoder=encoder, threads=1)
    result = agreement(reference, onnx.score(texts), labels)
    assert result.n == len(texts) and result.max_abs_diff < 1e-4 and result.decision_flips == 0
    assert result.f1_candidate == result.f1_reference
    # the order of the output is the order of the input, whatever the length-sorted batching did
    assert np.allclose(onnx.score(texts[::-1]), reference[::-1], atol=1e-4)


def test_int8_stays_within_its_tolerance_and_reports_flips(tiny_d4, exported, encoder, test_texts) -> None:
    detector, _ = tiny_d4
    texts, labels = test_texts
    reference = detector.score(texts)
    int8 = OnnxDetector.load(exported, "int8", encoder=encoder, threads=1)
    scores = int8.score(texts)
    result = agreement(reference, scores, labels)
    assert 0 < result.max_abs_diff < INT8_MAX_ABS_DIFF  # quantised: scores move, a little
    assert result.decision_flips == int(np.sum((reference >= 0.5) != (scores >= 0.5)))
    assert result.f1_change_points is not None and abs(result.f1_change_points) <= 100.0 * result.decision_flips


def test_an_int8_score_does_not_depend_on_the_texts_scored_with_it(exported, encoder, test_texts) -> None:
    """Dynamic int8 takes one activation scale per batch; scored one text per call, a verdict cannot be moved by
    its neighbours (a batch of 32 does move it: the reason for the default)."""
    texts, _ = test_texts
    int8 = OnnxDetector.load(exported, "int8", encoder=encoder, threads=1)
    assert int8.batch_size == 1
    together = int8.score(texts[:40])
    alone = np.array([int8.score([text])[0] for text in texts[:40]])
    assert np.array_equal(together, alone)
    batched = OnnxDetector.load(exported, "int8", encoder=encoder, threads=1, batch_size=32).score(texts[:40])
    assert not np.array_equal(batched, alone)


def test_a_swapped_graph_or_a_foreign_folder_is_refused(exported, encoder, tmp_path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in exported.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    graph = copy / "d4.int8.onnx"
    graph.write_bytes(graph.read_bytes()[:-16] + bytes(16))  # a changed graph: the digest no longer matches
    with pytest.raises(ChecksumMismatchError, match="d4.int8.onnx"):
        OnnxDetector.load(copy, "int8", encoder=encoder)
    record = json.loads((copy / ONNX_CONFIG).read_text())
    (copy / ONNX_CONFIG).write_text(json.dumps({**record, "format": "something-else/9"}))
    with pytest.raises(DetectorError, match="format"):
        OnnxDetector.load(copy, "float", encoder=encoder)
    with pytest.raises(DetectorError, match="no exported D4"):
        OnnxDetector.load(tmp_path, "float", encoder=encoder)
    with pytest.raises(DetectorError, match="variant"):
        OnnxDetector.load(exported, "fp16", encoder=encoder)  # type: ignore[arg-type]


def test_agreement_counts_flips_and_refuses_mismatched_lengths() -> None:
    result = agreement(np.array([0.1, 0.6, 0.49]), np.array([0.1, 0.4, 0.51]), [0, 1, 1])
    assert result.decision_flips == 2 and result.max_abs_diff == pytest.approx(0.2)
    assert result.f1_reference == pytest.approx(2 / 3) and result.f1_candidate == pytest.approx(2 / 3)
    with pytest.raises(DetectorError, match="reference scores"):
        agreement(np.zeros(2), np.zeros(3))


def test_the_onnx_runtime_is_a_new_version_of_the_registered_d4_with_its_own_alias(
    tiny_d4, exported, encoder, deepset
) -> None:
    """`current` stays the PyTorch reference (what evaluations load); `onnx` is the fast runtime, loaded back
    by name with the same scores, and as a plain mlflow.pyfunc model needing onnxruntime, not torch."""
    import mlflow.pyfunc
    import pandas as pd

    from rvu_pipelines.detectors import load_registered_detector, register_detector, registered_name
    from rvu_pipelines.detectors.finetune import FinetunedDetector
    from rvu_pipelines.detectors.registry import ONNX_ALIAS
    from rvu_pipelines.tracking import MlflowTracker

    tracker = MlflowTracker(experiment="onnx-registry-test")
    name = registered_name("d4", "onnx-registry-test")
    fast = OnnxDetector.load(exported, "int8", encoder=encoder)
    with tracker.run("register-d4-onnx") as run:
        reference = register_detector(tiny_d4[0], name=name, run_id=run.run_id, tracking_uri=tracker.tracking_uri)
        onnx = register_detector(
            fast, name=name, run_id=run.run_id, tracking_uri=tracker.tracking_uri, alias=ONNX_ALIAS
        )
    assert int(onnx.version) == int(reference.version) + 1 and onnx.kind == "d4_onnx"
    probe = deepset.texts("test")[:24]
    loaded = load_registered_detector(name, tracker.tracking_uri, alias=ONNX_ALIAS)
    assert isinstance(loaded, OnnxDetector) and loaded.variant == "int8"
    assert np.array_equal(loaded.score(probe), fast.score(probe))
    assert isinstance(load_registered_detector(name, tracker.tracking_uri), FinetunedDetector)  # current: PyTorch
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracker.tracking_uri)
    try:
        pyfunc = mlflow.pyfunc.load_model(f"models:/{name}@{ONNX_ALIAS}")
        requirements = Path(mlflow.pyfunc.get_model_dependencies(f"models:/{name}@{ONNX_ALIAS}")).read_text()
    finally:
        mlflow.set_tracking_uri(previous)
    assert np.allclose(pyfunc.predict(pd.DataFrame({"text": probe})), fast.score(probe), atol=1e-6)
    assert "onnxruntime==" in requirements and "torch" not in requirements
