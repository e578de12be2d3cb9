"""Memory-poisoning attacks by name: each attack's module registers a :class:`PoisoningAttackSpec` (its name, its
label in tables, whether the seed paper reports it, and how a study sets it up as a cell), and the studies, the
seeds sweep and the partitioned cells ask for it here. The study's axis (``study_cells.ATTACKS``, the order tables
and partitions follow) must name exactly the registered attacks; a test checks it. Where an attack writes into
memory (a tool output, the user's own turn) is its ``AttackRun.channel``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.plugins import import_package_modules

ATTACK_PACKAGE = "rvu_pipelines.memory_poisoning.attacks"
# (frames by catalog name, study_cells.EmbeddingCache, study_cells.StudyConfig) -> study_cells.AttackCell
CellBuilder = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class PoisoningAttackSpec:
    name: str
    label: str  # the short column label of the paper comparison, e.g. "AP"
    build_cell: CellBuilder
    in_paper: bool = False  # one of the seed paper's attack classes: its published numbers sit beside ours


_ATTACKS: dict[str, PoisoningAttackSpec] = {}


def poisoning_attack(name: str, *, label: str, in_paper: bool = False) -> Callable[[CellBuilder], CellBuilder]:
    """Register the decorated function as the cell builder of attack ``name``."""

    def register(build_cell: CellBuilder) -> CellBuilder:
        existing = _ATTACKS.get(name)
        if existing is not None and existing.build_cell.__module__ != build_cell.__module__:
            raise MemoryPoisoningInputError(
                f"Two memory-poisoning attacks are registered as '{name}': in {existing.build_cell.__module__} and "
                f"{build_cell.__module__}."
            )
        _ATTACKS[name] = PoisoningAttackSpec(name, label, build_cell, in_paper)
        return build_cell

    return register


def registered_poisoning_attacks() -> dict[str, PoisoningAttackSpec]:
    """Every attack a module of the attacks package registers, by name (sorted)."""
    import_package_modules(ATTACK_PACKAGE)
    return dict(sorted(_ATTACKS.items()))


def poisoning_attack_spec(name: str) -> PoisoningAttackSpec:
    """The attack ``name``, or a clear error naming the registered ones."""
    registered = registered_poisoning_attacks()
    if name not in registered:
        raise MemoryPoisoningInputError(f"unknown attack {name!r}; choose one of {', '.join(registered)}")
    return registered[name]
