"""What every attack produces: the poisoned entries it writes and the victim queries it targets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.corpus import MemoryEntry

CHANNELS = ("tool_output", "user_input")  # the incident log's action types a poison can arrive by


@dataclass(frozen=True)
class AttackRun:
    """One attack's output on one corpus.

    ``poisons`` are the entries the attacker gets written (``origin`` = the attack's name);
    ``victim_queries`` are the queries, exactly as the victim sends them (AgentPoison's carry its
    trigger), on which ASR-R is measured; ``trigger`` is the optimised trigger where there is one;
    ``details`` records how the attack was built (steps, losses, seeds) for the asset metadata; ``channel``
    is how the poison reaches the memory, as the incident log records the attacker's action: through a tool's
    output (AgentPoison, InjecMem), or as the attacker's own queries to the agent (MINJA: ``user_input``).
    """

    name: str
    poisons: tuple[MemoryEntry, ...]
    victim_queries: tuple[str, ...]
    trigger: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    channel: str = "tool_output"

    def __post_init__(self) -> None:
        if self.channel not in CHANNELS:
            raise MemoryPoisoningInputError(
                f"Attack {self.name!r}: channel {self.channel!r} is not one of {', '.join(CHANNELS)}."
            )
