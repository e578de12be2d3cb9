"""Every partition definition of the code location, in one place: assets, jobs and sensors import it
from here instead of from each other's modules."""

from dagster import DynamicPartitionsDefinition, MultiPartitionsDefinition, StaticPartitionsDefinition

from rvu_pipelines.adapters.zoo import zoo_ids
from rvu_pipelines.memory_poisoning.corpus import MEMORY_REGIMES
from rvu_pipelines.memory_poisoning.study_cells import ATTACKS as POISONING_ATTACKS
from rvu_pipelines.scenarios.axes import ATTACKS, BENCHMARKS, CANONICAL, DEFENSES
from rvu_pipelines.spectral.cell import SOURCES, profile_names

ARM_SEPARATOR = "."  # Dagster refuses "|", ",", "[" and "]" in a dimension's keys; no attack or defense has a "."


def arm_key(attack: str, defense: str) -> str:
    """The ``arm`` partition key of one attack under one defense, e.g. ``native.rvg``."""
    return f"{attack}{ARM_SEPARATOR}{defense}"


def parse_arm(arm: str) -> tuple[str, str]:
    """``attack.defense`` -> (attack, defense)."""
    attack, separator, defense = arm.partition(ARM_SEPARATOR)
    if not separator or not attack or not defense:
        raise ValueError(f"Arm {arm!r} is not <attack>{ARM_SEPARATOR}<defense>.")
    return attack, defense


# one attack-table cell per (benchmark, attack × defense): Dagster takes at most two dimensions, so attack and
# defense share the ``arm`` dimension; "canonical" is Table 1's fixed 10 scenarios. Keys read
# "native.vanilla|canonical" (dimensions in name order).
cell_partitions = MultiPartitionsDefinition(
    {
        "benchmark": StaticPartitionsDefinition([CANONICAL, *BENCHMARKS]),
        "arm": StaticPartitionsDefinition([arm_key(a, d) for a in ATTACKS for d in DEFENSES]),
    }
)

# one partition per accepted incident log, keyed by its content sha256 (added by the incident sensor)
INCIDENTS = "incidents"
incident_partitions = DynamicPartitionsDefinition(name=INCIDENTS)

# one memory-poisoning cell per (attack class, memory regime): seed 003's |M| = 200 / 1,000 / every record
poisoning_partitions = MultiPartitionsDefinition(
    {
        "attack": StaticPartitionsDefinition(list(POISONING_ATTACKS)),
        "regime": StaticPartitionsDefinition(list(MEMORY_REGIMES)),
    }
)

# one spectral kill-switch cell per (data source, model profile of configs/models.yaml); keys read "tiny|bipia"
spectral_partitions = MultiPartitionsDefinition(
    {"source": StaticPartitionsDefinition(list(SOURCES)), "profile": StaticPartitionsDefinition(profile_names())}
)

# one partition per adapter of configs/adapter_zoo.yaml: the evaluated zoo, its safety reference and the agent's
# tool-use adapter
adapter_partitions = StaticPartitionsDefinition(zoo_ids())
