"""Load YAML configs into typed pydantic models, with errors that name the file, key and fix."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rvu_pipelines.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)


def format_validation_error(source: str, error: ValidationError) -> str:
    lines = [f"Invalid config in {source}:"]
    for issue in error.errors():
        key = ".".join(str(part) for part in issue["loc"]) or "<root>"
        lines.append(f"  key '{key}': {issue['msg']}")
    return "\n".join(lines)


def load_yaml_config(path: Path, model: type[ModelT]) -> ModelT:
    """Parse ``path`` into ``model``; any problem becomes a ConfigError naming the key."""
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}. Set RVU_CONFIG_DIR to the folder holding it.")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {path} is not valid YAML: {exc}") from exc
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from exc
