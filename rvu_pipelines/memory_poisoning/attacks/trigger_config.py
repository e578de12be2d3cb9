"""AgentPoison's trigger-search settings, apart from the search itself: the study's configuration names them
without importing the attack."""

from __future__ import annotations

from dataclasses import dataclass

from rvu_pipelines.errors import MemoryPoisoningInputError


@dataclass(frozen=True)
class TriggerConfig:
    """The trigger search's knobs. The defaults keep the search short on a CPU with MiniLM-L6."""

    length: int = 5
    iterations: int = 20
    candidates: int = 10
    n_clusters: int = 5
    compactness_weight: float = 0.1
    seed: int = 0

    @classmethod
    def tiny(cls, seed: int = 0) -> TriggerConfig:
        """A few seconds: for tests."""
        return cls(length=3, iterations=4, candidates=5, seed=seed)

    def validate(self) -> None:
        if self.length < 1:
            raise MemoryPoisoningInputError(f"trigger length must be at least 1 token, got {self.length}")
        if self.iterations < 0 or self.candidates < 1:
            raise MemoryPoisoningInputError(
                f"trigger search needs iterations >= 0 and candidates >= 1, got {self.iterations} / {self.candidates}"
            )
        if self.n_clusters < 1:
            raise MemoryPoisoningInputError(f"n_clusters must be at least 1, got {self.n_clusters}")
