"""RVG's realistic tool plan: which tools a request may use, decided before the episode from what a
deployment has at that point, the user's request and the suite's tool declarations (``configs/rvg_policies.yaml``).

A suite policy lists the tools that only read (always allowed) and *intents*: tools that change the
environment, each allowed only when the request names that intent. An intent matches when every one of
its keyword groups has a keyword at the start of a word of the request (case-insensitive prefix match:
``schedul`` matches "scheduled"). Nothing here reads a benchmark's ground-truth solution or any tool
output; the plan is fixed before the first tool call, so text the tools return cannot widen it.
The answer-key gate (``rvg_oracle``) is kept apart as an upper bound.

Plain data and regexes: it loads (and its errors name the file) without the agent stack.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rvu_pipelines.config import load_yaml_config
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import config_dir


class Intent(BaseModel):
    """Tools a request may use when it states this intent: every group needs one keyword in the request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tools: tuple[str, ...] = Field(min_length=1)
    match: tuple[tuple[str, ...], ...] = Field(min_length=1)

    def matched(self, request: str) -> tuple[str, ...] | None:
        """The keyword found for each group, or None when some group has none in the request."""
        found = []
        for group in self.match:
            hit = next((keyword for keyword in group if _keyword(keyword).search(request)), None)
            if hit is None:
                return None
            found.append(hit)
        return tuple(found)


@lru_cache(maxsize=1024)
def _keyword(keyword: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(keyword.strip()), re.IGNORECASE)


@dataclass(frozen=True)
class ToolPlan:
    """The tools one request may use, and why each is in the set (for the trace and the provenance log)."""

    allowed: frozenset[str]
    reasons: dict[str, str]


class SuitePolicy(BaseModel):
    """One suite: the read-only tools and the intents that unlock the tools that change something."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    read_only: tuple[str, ...] = ()
    intents: dict[str, Intent] = Field(default_factory=dict)

    def tools(self) -> frozenset[str]:
        return frozenset(self.read_only) | frozenset(t for intent in self.intents.values() for t in intent.tools)

    def plan(self, request: str, declared: Iterable[str], where: str = "rvg_policies") -> ToolPlan:
        """The tools this request may use. ``declared``: the tool names the suite declares (the runtime's
        functions); a policy naming a tool that is not declared is a configuration error."""
        declared = frozenset(declared)
        unknown = sorted(self.tools() - declared)
        if unknown:
            raise ConfigError(
                f"{where}: tool(s) {unknown} are not declared by this suite; declared: {', '.join(sorted(declared))}."
            )
        reasons = {tool: "read-only look-up" for tool in self.read_only}
        for name, intent in self.intents.items():
            hits = intent.matched(request)
            if hits is None:
                continue
            for tool in intent.tools:
                reasons.setdefault(tool, f"the request states the intent '{name}' ({', '.join(hits)})")
        return ToolPlan(frozenset(reasons), dict(sorted(reasons.items())))


class RvgPolicies(BaseModel):
    """``configs/rvg_policies.yaml``, validated: one policy per AgentDojo suite."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    agentdojo: dict[str, SuitePolicy]

    def suite(self, suite_name: str) -> SuitePolicy:
        policy = self.agentdojo.get(suite_name)
        if policy is None:
            raise ConfigError(
                f"configs/rvg_policies.yaml has no policy for the AgentDojo suite '{suite_name}' (it has: "
                f"{', '.join(sorted(self.agentdojo))}); RVG never falls back to the answer key: add one."
            )
        return policy


def rvg_policies_path() -> Path:
    return config_dir() / "rvg_policies.yaml"


def load_rvg_policies(path: Path | str | None = None) -> RvgPolicies:
    """Read and validate the policies; ConfigError names the file and the key (the shared YAML loader)."""
    return load_yaml_config(Path(path) if path is not None else rvg_policies_path(), RvgPolicies)
