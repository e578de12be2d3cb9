"""Which scenarios a cell of the attack table runs: the canonical 10, or a fixed-seed benchmark sample.

Importable without AgentDojo (the harness, and through it the Dagster code location, import it); the
benchmark loaders in ``registry`` are imported when scenarios are actually asked for.
"""

from __future__ import annotations

from rvu_pipelines.scenarios.axes import CANONICAL
from rvu_pipelines.scenarios.contract import Scenario


def scenarios_for(benchmark: str, limit: int | None = None, seed: int = 42) -> list[Scenario]:
    """The canonical 10, or a fixed-seed sample of one benchmark."""
    # runtime only: the registry's loaders import AgentDojo (seconds), which the code location must not pay
    from rvu_pipelines.scenarios.registry import canonical_scenarios, load_scenarios

    if benchmark == CANONICAL:
        scenarios = canonical_scenarios()
        return scenarios[:limit] if limit else scenarios
    return load_scenarios(benchmark, limit=limit, seed=seed)
