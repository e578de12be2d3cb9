"""Every partition definition of the code location, in one place: assets, jobs and sensors import it
from here instead of from each other's modules."""

from dagster import DynamicPartitionsDefinition, MultiPartitionsDefinition, StaticPartitionsDefinition

from rvu_pipelines.adapters.zoo import zoo_ids
from rvu_pipelines.memory_poisoning.corpus import MEMORY_REGIMES
from rvu_pipelines.memory_poisoning.study_cells import ATTACKS
from rvu_pipelines.scenarios.axes import BENCHMARKS, CANONICAL, DEFENSES
from rvu_pipelines.spectral.cell import SOURCES, profile_names

# one attack-table cell per (benchmark, defense); "canonical" is Table 1's fixed 10 scenarios
cell_partitions = MultiPartitionsDefinition(
    {
        "benchmark": StaticPartitionsDefinition([CANONICAL, *BENCHMARKS]),
        "defense": StaticPartitionsDefinition(list(DEFENSES)),
    }
)

# one partition per accepted incident log, keyed by its content sha256 (added by the incident sensor)
INCIDENTS = "incidents"
incident_partitions = DynamicPartitionsDefinition(name=INCIDENTS)

# one memory-poisoning cell per (attack class, memory regime): seed 003's |M| = 200 / 1,000 / every record
poisoning_partitions = MultiPartitionsDefinition(
    {"attack": StaticPartitionsDefinition(list(ATTACKS)), "regime": StaticPartitionsDefinition(list(MEMORY_REGIMES))}
)

# one spectral kill-switch cell per (data source, model profile of configs/models.yaml); keys read "tiny|bipia"
spectral_partitions = MultiPartitionsDefinition(
    {"source": StaticPartitionsDefinition(list(SOURCES)), "profile": StaticPartitionsDefinition(profile_names())}
)

# one partition per adapter of configs/adapter_zoo.yaml: the evaluated zoo, its safety reference and the agent's
# tool-use adapter
adapter_partitions = StaticPartitionsDefinition(zoo_ids())
