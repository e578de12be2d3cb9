"""What every attack produces: the poisoned entries it writes and the victim queries it targets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rvu_pipelines.memory_poisoning.corpus import MemoryEntry


@dataclass(frozen=True)
class AttackRun:
    """One attack's output on one corpus.

    ``poisons`` are the entries the attacker gets written (``origin`` = the attack's name);
    ``victim_queries`` are the queries, exactly as the victim sends them (AgentPoison's carry its
    trigger), on which ASR-R is measured; ``trigger`` is the optimised trigger where there is one;
    ``details`` records how the attack was built (steps, losses, seeds) for the asset metadata.
    """

    name: str
    poisons: tuple[MemoryEntry, ...]
    victim_queries: tuple[str, ...]
    trigger: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
