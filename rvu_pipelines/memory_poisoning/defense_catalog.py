"""Write-time defenses by name: each defense's module registers how to build a fresh, unfitted detector from the
study's ``kappa`` (and the composite's own ``composite_kappa``), and the matrix asks for it here. The study's axis
(``study.PAPER_DEFENSES`` + ``study.EXTRA_DEFENSES``, the order of its tables) must name exactly the registered
defenses; a test checks it. The hybrid check, whose LLM feature needs a model path, is built by the study itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.plugins import import_package_modules

if TYPE_CHECKING:
    from rvu_pipelines.memory_poisoning.defenses.base import WriteDetector

DEFENSE_PACKAGE = "rvu_pipelines.memory_poisoning.defenses"
DefenseBuilder = Callable[[float, float], "WriteDetector"]  # (kappa, composite_kappa) -> a fresh detector


@dataclass(frozen=True)
class WriteDefenseSpec:
    name: str
    build: DefenseBuilder
    in_paper: bool = False  # one of the seed paper's defenses: its published numbers sit beside ours


_DEFENSES: dict[str, WriteDefenseSpec] = {}


def write_defense(name: str, *, in_paper: bool = False) -> Callable[[DefenseBuilder], DefenseBuilder]:
    """Register the decorated ``(kappa, composite_kappa) -> WriteDetector`` as defense ``name``."""

    def register(build: DefenseBuilder) -> DefenseBuilder:
        existing = _DEFENSES.get(name)
        if existing is not None and existing.build.__module__ != build.__module__:
            raise MemoryPoisoningInputError(
                f"Two write-time defenses are registered as '{name}': in {existing.build.__module__} and "
                f"{build.__module__}."
            )
        _DEFENSES[name] = WriteDefenseSpec(name, build, in_paper)
        return build

    return register


def registered_write_defenses() -> dict[str, WriteDefenseSpec]:
    """Every defense a module of the defenses package registers, by name (sorted)."""
    import_package_modules(DEFENSE_PACKAGE)
    return dict(sorted(_DEFENSES.items()))


def write_defense_spec(name: str) -> WriteDefenseSpec:
    """The defense ``name``, or a clear error naming the registered ones."""
    registered = registered_write_defenses()
    if name not in registered:
        raise MemoryPoisoningInputError(f"unknown write-time defense {name!r}; choose one of {', '.join(registered)}")
    return registered[name]
