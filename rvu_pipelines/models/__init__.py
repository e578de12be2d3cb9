"""Model resolution (package / local / hub, sha256-verified), chat LLMs and sentence embedders."""

from rvu_pipelines.models.llm import (
    ChatCompletion,
    ChatModel,
    LlamaCppChatModel,
    OpenAICompatibleChatModel,
)
from rvu_pipelines.models.specs import ROLES, ModelConfig, ModelSpec, load_model_config
from rvu_pipelines.models.store import ModelStore, ResolvedModel

__all__ = [
    "ROLES",
    "ChatCompletion",
    "ChatModel",
    "LlamaCppChatModel",
    "ModelConfig",
    "ModelSpec",
    "ModelStore",
    "OpenAICompatibleChatModel",
    "ResolvedModel",
    "load_model_config",
]
