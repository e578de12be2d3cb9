"""Typed form of configs/models.yaml: profiles mapping roles to model sources."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rvu_pipelines.config import load_yaml_config
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import config_dir, model_path_override
from rvu_pipelines.settings import model_profile

Role = Literal["llm", "embedder"]
ROLES: tuple[Role, ...] = ("llm", "embedder")
PROFILE_ENV = "RVU_MODEL_PROFILE"


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    source: Literal["package", "local", "hub"]
    licence: str = "unknown"
    file: str = ""
    package: str | None = None
    distribution: str | None = None
    path: str | None = None
    repo: str | None = None
    revision: str = "main"
    allow_patterns: list[str] | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    sha256_of: str | None = None
    n_ctx: int = Field(default=2048, ge=256)

    @model_validator(mode="after")
    def _fields_for_source(self) -> ModelSpec:
        required = {"package": ("package", "file"), "local": ("path",), "hub": ("repo", "file")}[self.source]
        missing = [key for key in required if not getattr(self, key)]
        if missing:
            raise ValueError(f"source '{self.source}' needs {', '.join(missing)}")
        if self.source == "package" and not self.sha256:
            raise ValueError("a package-shipped model must pin sha256")
        return self


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default_profile: str
    profiles: dict[str, dict[Role, ModelSpec]]

    @model_validator(mode="after")
    def _check_profiles(self) -> ModelConfig:
        if self.default_profile not in self.profiles:
            raise ValueError(
                f"default_profile '{self.default_profile}' is not a profile; allowed values: {sorted(self.profiles)}"
            )
        for name, roles in self.profiles.items():
            missing = [role for role in ROLES if role not in roles]
            if missing:
                raise ValueError(f"profile '{name}' lacks roles {missing}")
        return self

    def profile(self, name: str | None = None) -> dict[Role, ModelSpec]:
        """The named profile (else RVU_MODEL_PROFILE, else default), with local-path overrides applied."""
        chosen = name or model_profile() or self.default_profile
        if chosen not in self.profiles:
            raise ConfigError(
                f"Invalid config: key 'profile' (or {PROFILE_ENV}) is '{chosen}'; "
                f"allowed values: {', '.join(sorted(self.profiles))}"
            )
        return {role: _with_env_override(role, spec) for role, spec in self.profiles[chosen].items()}

    def profile_name(self, name: str | None = None) -> str:
        return name or model_profile() or self.default_profile


def _with_env_override(role: str, spec: ModelSpec) -> ModelSpec:
    """RVU_MODEL_<ROLE>_PATH points a role at a local file or folder (sha256 from RVU_MODEL_<ROLE>_SHA256)."""
    override = model_path_override(role)
    if override is None:
        return spec
    path, sha256 = override
    return ModelSpec(
        name=Path(path).name,
        source="local",
        path=path,
        licence="see the model's own licence",
        sha256=sha256,
        n_ctx=spec.n_ctx,
    )


def load_model_config(path: Path | None = None) -> ModelConfig:
    return load_yaml_config(path or config_dir() / "models.yaml", ModelConfig)
