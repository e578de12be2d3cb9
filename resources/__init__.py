"""Dagster resources: thin ConfigurableResources that build library objects from config / environment."""

from resources.data_source import DatasetSourceResource
from resources.embedder import EmbedderResource
from resources.io_manager import LocalTableIOManager
from resources.llm import LLMResource
from resources.model_store import ModelStoreResource
from resources.tracker import MlflowTrackerResource

__all__ = [
    "DatasetSourceResource",
    "EmbedderResource",
    "LLMResource",
    "LocalTableIOManager",
    "MlflowTrackerResource",
    "ModelStoreResource",
]
