from pathlib import Path
from typing import Literal

from dagster import ConfigurableResource
from pydantic import Field

from rvu_pipelines.models import ChatModel, LlamaCppChatModel, OpenAICompatibleChatModel


class LLMResource(ConfigurableResource):
    """The chat model: llama.cpp in-process by default, or any OpenAI-compatible endpoint."""

    backend: Literal["llama_cpp", "openai_compatible"] = "llama_cpp"
    base_url: str | None = Field(
        default=None, description="Endpoint for openai_compatible, e.g. http://127.0.0.1:8080/v1"
    )
    model: str | None = Field(default=None, description="Model name sent to the endpoint.")
    extra_body: dict[str, float] = Field(
        default_factory=dict, description="Server-specific sampling fields, e.g. repeat_penalty."
    )
    n_threads: int | None = None
    seed: int = 0

    def build(self, model_path: Path, *, n_ctx: int = 2048, name: str | None = None) -> ChatModel:
        if self.backend == "openai_compatible":
            if not self.base_url:
                from rvu_pipelines.errors import ConfigError

                raise ConfigError("Invalid config: key 'llm.base_url' is required when backend is 'openai_compatible'")
            return OpenAICompatibleChatModel(
                self.base_url, self.model or (name or Path(model_path).name), extra_body=dict(self.extra_body)
            )
        return LlamaCppChatModel(model_path, n_ctx=n_ctx, n_threads=self.n_threads, seed=self.seed, name=name)
