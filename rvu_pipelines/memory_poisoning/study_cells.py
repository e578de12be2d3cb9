"""The attacks set up for evaluation: one ``AttackCell`` per attack and memory regime. Each attack's cell builder
lives in its own module (``attacks/<name>.py``, registered in ``attack_catalog``) and uses the helpers here.

A cell holds everything a detector and the retrieval metrics need, embedded once:

- the benign memory the attack targets and the benign reference set a detector calibrates on;
- the benign writes a detector is tested on (negatives) and the attack's poisons (positives);
- the query history the defender has served before the writes (``history``: the first half of the
  victim queries, sent as the victims send them) and the victim queries ASR-R is measured on (the
  second half); for AgentPoison also the untriggered history (plain calibration) beside the
  triggered one (triggered calibration), and the untriggered evaluation queries (the inconsistent
  protocol); ``study.history_for`` mixes the two into the histories a defender has at write time;
- benign queries whose top-k a defense must not disturb: each benign write's own question (a false
  rejection removes exactly the entry that question retrieves) and the plain test questions.

The random-trigger control (``agentpoison_random_trigger``) is AgentPoison with an unoptimised random
trigger of the same length: the same split, poison template, memory and protocol. Whatever it reaches
(ASR-R, a detector's AUROC) the trigger optimisation cannot claim. ``agentpoison_varied`` is AgentPoison's
own trigger, split and victims with poisons that carry no template (``attacks/varied.py``: real search lines,
InjecAgent instructions and flipped answers in the memory's format): what a template filter reaches on
AgentPoison and not here was the template's.

Memories: AgentPoison and InjecMEM attack the StrategyQA memory of the regime. MINJA attacks a
shopping agent, so its memory is the regime's size drawn half from StrategyQA and half from benign
WebShop sessions: of the *other* MINJA victims, plus earlier benign sessions about the victim's own
item (``minja_same_item``; without them the victim's item would appear only in the poisons and any
retriever or detector would find them trivially). Its reference is half StrategyQA, half held-out
sessions of other victims; its benign writes add the held-out third of the same-item sessions, the
writes a detector is most likely to flag wrongly. MINJA is run on each of the nine victim settings
and pooled (``members``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.attack_catalog import poisoning_attack_spec
from rvu_pipelines.memory_poisoning.attacks.base import AttackRun
from rvu_pipelines.memory_poisoning.attacks.trigger_config import TriggerConfig
from rvu_pipelines.memory_poisoning.corpus import MemoryEntry
from rvu_pipelines.memory_poisoning.retrieval import embed_texts
from rvu_pipelines.models.embedding import Embedder, RememberingEmbedder

_EVERY_TEXT = 10**9  # a study keeps every text it embedded: its records recur in every cell
ATTACKS = ("agentpoison", "agentpoison_random_trigger", "agentpoison_varied", "minja", "injecmem")


@dataclass(frozen=True)
class StudyConfig:
    """Knobs of one study run; the defaults are the full study at |M| = 1,000."""

    regime: str = "medium"
    kappa: float = 2.0
    top_k: int = 5
    seed: int = 0
    n_queries: int | None = None  # subsample of the 490 StrategyQA test questions (sampled job)
    agentpoison_poisons: int = 5
    agentpoison_train: int = 16
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    minja_attack_queries: int = 10
    minja_same_item: int = 30  # benign sessions about the victim's own item: 2/3 in the memory, 1/3 benign writes
    minja_victims: tuple[str, ...] | None = None  # None: all nine
    injecmem_entities: int = 5
    injecmem_per_entity: int = 3
    adaptive_poisons: int | None = None  # None: every AgentPoison poison is rewritten by each adaptive attack
    adaptive_methods: tuple[str, ...] = ("synonym", "hotflip")

    @classmethod
    def sampled(cls) -> StudyConfig:
        """The default job's version: |M| = 200, 100 test questions, a short trigger search, 2 MINJA victims,
        the synonym attack on 1 poison (each adaptive rewrite costs many embedding passes)."""
        return cls(
            regime="small",
            n_queries=100,
            trigger=TriggerConfig(length=4, iterations=8, candidates=8),
            minja_victims=("camera", "chair"),
            adaptive_poisons=1,
            adaptive_methods=("synonym",),
        )


@dataclass(frozen=True)
class AttackCell:
    """One attack against one memory, embedded (see module doc). ``members`` pools MINJA's victims."""

    attack: AttackRun
    memory: tuple[MemoryEntry, ...]
    memory_vectors: np.ndarray
    reference: tuple[MemoryEntry, ...]
    reference_vectors: np.ndarray
    benign_writes: tuple[MemoryEntry, ...]
    benign_vectors: np.ndarray
    poison_vectors: np.ndarray
    history_vectors: np.ndarray
    history_texts: tuple[str, ...]
    victim_vectors: np.ndarray
    victim_texts: tuple[str, ...]
    benign_query_vectors: np.ndarray
    plain_history_vectors: np.ndarray | None = None  # AgentPoison: the history without the trigger
    plain_history_texts: tuple[str, ...] = ()
    plain_victim_vectors: np.ndarray | None = None  # AgentPoison: the inconsistent protocol's queries
    plain_victim_texts: tuple[str, ...] = ()
    members: tuple[AttackCell, ...] = ()

    @property
    def name(self) -> str:
        return self.attack.name


class EmbeddingCache:
    """What a study computes once: each distinct text's embedding (the same records recur across cells) and
    each split's AgentPoison trigger search (``trigger_runs``; the varied-poison cell reuses it)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._remembered = RememberingEmbedder(embedder, max_texts=_EVERY_TEXT)
        self.trigger_runs: dict[tuple[object, ...], AttackRun] = {}  # one trigger search per split and config

    def __call__(self, texts: Sequence[str], what: str) -> np.ndarray:
        return embed_texts(self._remembered, list(texts), what)


def question_of(entry: MemoryEntry) -> str:
    """The question a record answers (its first line), the benign query that should retrieve it."""
    return entry.text.splitlines()[0].removeprefix("Question: ").removeprefix("Instruction: ").strip()


def halves(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """Alternate items into (history, evaluation): both halves span the whole (sorted) stream."""
    if len(items) < 2:
        raise MemoryPoisoningInputError(f"an attack needs at least 2 victim queries to split, got {len(items)}")
    return list(items[0::2]), list(items[1::2])


def frame_named(frames: Mapping[str, pl.DataFrame], name: str) -> pl.DataFrame:
    if name not in frames:
        raise MemoryPoisoningInputError(f"the memory-poisoning study needs the {name!r} data set; load it first")
    return frames[name]


def embedded_cell(
    embed: EmbeddingCache,
    run: AttackRun,
    memory: Sequence[MemoryEntry],
    reference: Sequence[MemoryEntry],
    benign: Sequence[MemoryEntry],
    history: Sequence[str],
    victims: Sequence[str],
    benign_queries: Sequence[str],
) -> AttackCell:
    return AttackCell(
        attack=run,
        memory=tuple(memory),
        memory_vectors=embed([e.text for e in memory], "memory"),
        reference=tuple(reference),
        reference_vectors=embed([e.text for e in reference], "reference entries"),
        benign_writes=tuple(benign),
        benign_vectors=embed([e.text for e in benign], "benign writes"),
        poison_vectors=embed([p.text for p in run.poisons], f"{run.name} poisons"),
        history_vectors=embed(list(history), "query history"),
        history_texts=tuple(history),
        victim_vectors=embed(list(victims), "victim queries"),
        victim_texts=tuple(victims),
        benign_query_vectors=embed(list(benign_queries), "benign queries"),
    )


def build_cell(
    attack: str, frames: Mapping[str, pl.DataFrame], embed: EmbeddingCache, config: StudyConfig
) -> AttackCell:
    """The cell of attack ``attack`` (registered by its module, ``attack_catalog``) under ``config``."""
    return poisoning_attack_spec(attack).build_cell(frames, embed, config)
