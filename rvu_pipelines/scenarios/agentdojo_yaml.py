"""AgentDojo's environment parse on PyYAML's C loader.

AgentDojo builds an episode's world by formatting the injections into the suite's environment YAML and parsing the
text again (``TaskSuite.load_and_inject_default_environment``), once per episode and once per ground-truth lookup.
It parses with ``yaml.safe_load``, PyYAML's pure-Python scanner, slow on the larger suites (the workspace suite's
environment is 54 kB of YAML). Where PyYAML was built with libyaml,
:func:`install_libyaml_parser` points AgentDojo's task-suite module at a ``yaml`` whose ``safe_load`` scans with
the C loader (``CSafeLoader``: the same safe constructor, so the same Python objects). A text the C loader
refuses is parsed again by the pure-Python loader, so an error reads exactly as AgentDojo's own.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import yaml


def libyaml_safe_load(stream: Any) -> Any:
    """``yaml.safe_load`` scanned by libyaml; a text libyaml refuses goes to the pure-Python loader."""
    try:
        return yaml.load(stream, Loader=yaml.CSafeLoader)  # noqa: S506 - CSafeLoader is the safe loader in C
    except yaml.YAMLError:
        if not isinstance(stream, str | bytes):
            raise  # a file was read by the attempt; it cannot be read again
        return yaml.safe_load(stream)


class _LibyamlModule(types.ModuleType):
    """The ``yaml`` module as AgentDojo's task-suite module sees it: everything real except ``safe_load``."""

    def __init__(self) -> None:
        super().__init__("yaml")
        self.safe_load = libyaml_safe_load

    def __getattr__(self, name: str) -> Any:
        return getattr(yaml, name)


_LIBYAML = _LibyamlModule()
_TASK_SUITE_MODULE = "agentdojo.task_suite.task_suite"


def install_libyaml_parser() -> bool:
    """Point AgentDojo's task-suite module's ``yaml`` at the C-scanning one; idempotent. Returns whether the
    module now parses with libyaml (False where PyYAML has no libyaml, or AgentDojo is not loaded)."""
    module = sys.modules.get(_TASK_SUITE_MODULE)
    if module is None or not getattr(yaml, "__with_libyaml__", False):
        return False
    if getattr(module, "yaml", None) is yaml:
        module.yaml = _LIBYAML  # type: ignore[attr-defined]
    return getattr(module, "yaml", None) is _LIBYAML
