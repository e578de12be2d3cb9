"""The chat model resource: one interface, one implementation per backend; a deployment picks one."""

import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from dagster import ConfigurableResource
from pydantic import Field

from rvu_pipelines.models import ChatModel, LlamaCppChatModel, OpenAICompatibleChatModel


class LLMResource(ConfigurableResource, ABC):
    """The chat model the agents talk to. Assets depend on this; ``resources.deployments`` binds an
    implementation (in-process llama.cpp, or an OpenAI-compatible server)."""

    backend: ClassVar[str]  # recorded with every MLflow run that generated text

    @abstractmethod
    def build(self, model_path: Path, *, n_ctx: int = 2048, name: str | None = None) -> ChatModel:
        """The chat model for the profile's LLM role (``model_path``: its resolved GGUF file)."""


class LlamaCppLLMResource(LLMResource):
    """llama.cpp in-process (the embedded default): the profile's pinned GGUF file, temperature 0."""

    backend: ClassVar[str] = "llama_cpp"

    n_threads: int | None = Field(default=None, description="CPU threads; default: llama.cpp's choice.")
    seed: int = Field(default=0, description="Sampling seed (generation is greedy; kept for determinism).")

    def build(self, model_path: Path, *, n_ctx: int = 2048, name: str | None = None) -> ChatModel:
        return LlamaCppChatModel(model_path, n_ctx=n_ctx, n_threads=self.n_threads, seed=self.seed, name=name)


class OpenAICompatibleLLMResource(LLMResource):
    """Any OpenAI-compatible chat endpoint (llama.cpp server, vLLM, ...), for scale-out and production."""

    backend: ClassVar[str] = "openai_compatible"

    base_url: str = Field(description="Endpoint, e.g. http://127.0.0.1:8080/v1")
    model: str | None = Field(default=None, description="Model name sent to the endpoint; default: the GGUF name.")
    extra_body: dict[str, float] = Field(
        default_factory=dict, description="Server-specific sampling fields, e.g. repeat_penalty."
    )
    api_key_env: str = Field(
        default="OPENAI_API_KEY", description="The variable holding the server's API key, if it wants one."
    )

    def build(self, model_path: Path, *, n_ctx: int = 2048, name: str | None = None) -> ChatModel:
        return OpenAICompatibleChatModel(
            self.base_url,
            self.model or (name or Path(model_path).name),
            extra_body=dict(self.extra_body),
            api_key=os.environ.get(self.api_key_env) or None,
        )
