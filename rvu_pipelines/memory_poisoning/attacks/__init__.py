"""Memory-poisoning attacks, by escalating access (the paper's three classes) and the adaptive ones.

- ``agentpoison``: white-box trigger search against the encoder (write access + a trigger in the query);
- ``minja``: query-only injection through indication prompts, bridging steps and progressive shortening;
- ``injecmem``: one interaction, black-box on the encoder, retriever-agnostic anchors with real payloads;
- ``adaptive``: HotFlip and WordNet synonym substitution against a detector's ``score_fn``.
"""

from rvu_pipelines.memory_poisoning.attacks.adaptive import (
    AdaptiveSummary,
    EvasionResult,
    RetrievalObjective,
    hotflip_evasion,
    summarise,
    synonym_substitution,
)
from rvu_pipelines.memory_poisoning.attacks.agentpoison import (
    TriggerConfig,
    TriggerResult,
    agentpoison_attack,
    optimise_trigger,
    random_trigger_attack,
    untriggered_queries,
)
from rvu_pipelines.memory_poisoning.attacks.base import AttackRun
from rvu_pipelines.memory_poisoning.attacks.injecmem import bipia_payloads, injecagent_payloads, injecmem_attack
from rvu_pipelines.memory_poisoning.attacks.minja import indication_templates, minja_attack, shopping_records
from rvu_pipelines.memory_poisoning.attacks.synonyms import SynonymSource, WordNetSynonyms

__all__ = [
    "AdaptiveSummary",
    "AttackRun",
    "EvasionResult",
    "RetrievalObjective",
    "SynonymSource",
    "TriggerConfig",
    "TriggerResult",
    "WordNetSynonyms",
    "agentpoison_attack",
    "bipia_payloads",
    "hotflip_evasion",
    "indication_templates",
    "injecagent_payloads",
    "injecmem_attack",
    "minja_attack",
    "optimise_trigger",
    "random_trigger_attack",
    "shopping_records",
    "summarise",
    "synonym_substitution",
    "untriggered_queries",
]
