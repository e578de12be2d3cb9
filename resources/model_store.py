from dataclasses import replace

from dagster import ConfigurableResource
from pydantic import Field

from rvu_pipelines.models import ModelConfig, ModelSpec, ModelStore, ResolvedModel, load_model_config
from rvu_pipelines.paths import public_sources


class ModelStoreResource(ConfigurableResource):
    """Resolves each role of a model profile (configs/models.yaml) to sha256-verified weights."""

    profile: str | None = Field(
        default=None, description="Profile name; default RVU_MODEL_PROFILE, else the file's default."
    )
    offline: bool | None = Field(
        default=None, description="True: never reach a model hub; default: RVU_OFFLINE / HF_HUB_OFFLINE."
    )

    def config(self) -> ModelConfig:
        return load_model_config()

    def profile_name(self) -> str:
        return self.config().profile_name(self.profile)

    def spec(self, role: str) -> ModelSpec:
        return self.config().profile(self.profile)[role]  # type: ignore[index]

    def store(self) -> ModelStore:
        """The library's store, reaching the public hub as configured unless ``offline`` says otherwise."""
        public = public_sources()
        return ModelStore(public=public if self.offline is None else replace(public, offline=self.offline))

    def resolve(self, role: str) -> ResolvedModel:
        return self.store().resolve(role, self.spec(role))
