"""MLflow "models from code" entry point for a registered D4 detector.

MLflow copies this file into the logged model and runs it when the model is loaded with
``mlflow.pyfunc.load_model``; nothing in the package imports it. It exists so D4 is a standard
pyfunc model without pickling a Python object (MLflow would otherwise cloudpickle it). The weights
are the safetensors files saved by :meth:`FinetunedDetector.save`, passed as the ``detector`` artifact.
"""

from pathlib import Path

import mlflow
from mlflow.pyfunc import PythonModel


class FinetunedDetectorModel(PythonModel):
    """pyfunc predict: texts (a list, or a one-column DataFrame) -> P(injection) per text."""

    def load_context(self, context):  # type: ignore[no-untyped-def]
        from rvu_pipelines.detectors.finetune import FinetunedDetector

        self.detector = FinetunedDetector.load(Path(context.artifacts["detector"]))

    def predict(self, context, model_input: list[str], params=None) -> list[float]:  # type: ignore[no-untyped-def]
        return [float(score) for score in self.detector.score([str(text) for text in model_input])]


mlflow.models.set_model(FinetunedDetectorModel())
