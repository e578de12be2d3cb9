"""MLflow "models from code" entry point for a registered D4 on ONNX Runtime (the exported, fused graphs).

As ``mlflow_d4_model.py``, MLflow copies this file into the logged model and runs it on load; nothing in the
package imports it. The ``detector`` artifact is the folder written by ``onnx_d4.export_detector`` (graphs +
``onnx_detector.json`` with their sha256); the model's metadata names the variant it serves.
"""

from pathlib import Path

import mlflow
from mlflow.pyfunc import PythonModel


class OnnxDetectorModel(PythonModel):
    """pyfunc predict: texts (a list, or a one-column DataFrame) -> P(injection) per text."""

    def load_context(self, context):  # type: ignore[no-untyped-def]
        from rvu_pipelines.detectors.onnx_d4 import OnnxDetector

        variant = (context.model_config or {}).get("variant", "int8")
        self.detector = OnnxDetector.load(Path(context.artifacts["detector"]), variant)

    def predict(self, context, model_input: list[str], params=None) -> list[float]:  # type: ignore[no-untyped-def]
        return [float(score) for score in self.detector.score([str(text) for text in model_input])]


mlflow.models.set_model(OnnxDetectorModel())
