"""Dagster resources: thin ConfigurableResources over library objects. Assets name the interfaces here;
``resources.deployments`` binds an implementation per deployment (local / offline_mirror / production)."""

from resources.data_source import DatasetSourceResource, MirrorDatasetSourceResource, PublicDatasetSourceResource
from resources.embedder import EmbedderResource
from resources.io_manager import LocalTableIOManager
from resources.llm import LlamaCppLLMResource, LLMResource, OpenAICompatibleLLMResource
from resources.model_store import ModelStoreResource
from resources.recovery import RecoveryResource
from resources.tracker import MlflowTrackerResource

__all__ = [
    "DatasetSourceResource",
    "EmbedderResource",
    "LLMResource",
    "LlamaCppLLMResource",
    "LocalTableIOManager",
    "MirrorDatasetSourceResource",
    "MlflowTrackerResource",
    "ModelStoreResource",
    "OpenAICompatibleLLMResource",
    "PublicDatasetSourceResource",
    "RecoveryResource",
]
