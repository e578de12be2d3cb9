"""The two axes of the attack table (benchmarks × defenses), as plain names.

They sit on the scenario side so that agents/ (and the Dagster code location's partitions) import them
from here and scenarios/ never imports agents/. Importable without AgentDojo, so the code location loads
without paying for the agent stack until a cell runs.
"""

DEFENSES: tuple[str, ...] = ("vanilla", "classifier", "fath", "rvg", "rvu_v1", "rvu_v2")
RECOVERING_DEFENSES = frozenset({"rvu_v1", "rvu_v2"})  # the defenses that recover and certify after an episode
BENCHMARKS: tuple[str, ...] = (
    "injecagent_dh",
    "injecagent_ds",
    "bipia_email",
    "bipia_table",
    "bipia_code",
    "agentdojo",
)
CANONICAL = "canonical"  # the paper's 10 canonical scenarios, a pseudo-benchmark of the table
