"""The RVG tool boundary's policy: ``configs/tool_allowlist.yaml``, validated, one policy per benchmark.

Plain data and a glob matcher, so it loads (and its errors name the file) without the agent stack.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import config_dir

ALLOWLIST_BENCHMARKS: tuple[str, ...] = (
    "default",
    "injecagent_dh",
    "injecagent_ds",
    "bipia_email",
    "bipia_table",
    "bipia_code",
    "agentdojo",
)


class ToolPolicy(BaseModel):
    """One benchmark's tool boundary: task tools on/off, allow and deny globs (deny wins)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_tools: bool = True
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def decide(self, tool: str, task_tools: frozenset[str]) -> tuple[bool, str]:
        """(allowed, reason) for one call; the reason is what the model and the provenance log see."""
        for pattern in self.deny:
            if fnmatch.fnmatchcase(tool, pattern):
                return False, f"tool `{tool}` is denied by the allowlist pattern '{pattern}'"
        if self.task_tools and tool in task_tools:
            return True, f"tool `{tool}` is one of this task's tools"
        for pattern in self.allow:
            if fnmatch.fnmatchcase(tool, pattern):
                return True, f"tool `{tool}` is allowed by the pattern '{pattern}'"
        return False, f"tool `{tool}` is not allowed for this task"


class ToolAllowlist(BaseModel):
    """``configs/tool_allowlist.yaml``, validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    benchmarks: dict[str, ToolPolicy]

    def policy_for(self, benchmark: str) -> ToolPolicy:
        return self.benchmarks.get(benchmark) or self.benchmarks["default"]


def tool_allowlist_path() -> Path:
    return config_dir() / "tool_allowlist.yaml"


def load_tool_allowlist(path: Path | str | None = None) -> ToolAllowlist:
    """Read and validate the allowlist; ConfigError names the file, the key and the allowed values."""
    path = Path(path) if path is not None else tool_allowlist_path()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"Cannot read the tool allowlist {path}: {exc.strerror or exc}. "
            "Restore configs/tool_allowlist.yaml or set RVU_CONFIG_DIR."
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"The tool allowlist {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"The tool allowlist {path} must be a mapping with keys 'version' and 'benchmarks'.")
    benchmarks = raw.get("benchmarks")
    if not isinstance(benchmarks, dict):
        raise ConfigError(
            f"{path}: 'benchmarks' must be a mapping of benchmark name -> policy; "
            f"allowed names: {', '.join(ALLOWLIST_BENCHMARKS)}."
        )
    unknown = sorted(set(map(str, benchmarks)) - set(ALLOWLIST_BENCHMARKS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown benchmark key(s) {unknown} under 'benchmarks'; allowed: "
            f"{', '.join(ALLOWLIST_BENCHMARKS)}."
        )
    if "default" not in benchmarks:
        raise ConfigError(f"{path}: 'benchmarks.default' is missing; it is the policy for any benchmark not listed.")
    try:
        return ToolAllowlist.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()[:5]
        )
        raise ConfigError(
            f"{path}: invalid tool allowlist ({problems}). Each benchmark takes "
            "'task_tools' (true/false), 'allow' and 'deny' (lists of glob patterns)."
        ) from exc
