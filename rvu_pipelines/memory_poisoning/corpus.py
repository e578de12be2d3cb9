"""The agent memory the attacks poison: AgentPoison's ReAct-StrategyQA memory and its victim queries.

AgentPoison's ReAct-StrategyQA agent stored one record per solved question (the question, the term it
searched, the description it read, the answer); 2,821 records in ``train_filtered``, 490 test
questions it is later asked. We split the 2,821 once, with a fixed seed, into

- a held-out pool of ``HELD_OUT`` records that are never in the memory: ``reference`` (the benign
  reference set a detector is calibrated on) and ``benign_writes`` (the benign candidates a detector
  is tested on, disjoint from the reference);
- the rest, from which the memory regimes of the paper are drawn: |M| = 200 and |M| = 1,000, and
  ``full`` = every record not held out (2,821 - 400 = 2,421; the paper's 2,821 includes records
  it also calibrates on, which would let a detector see its own test writes).

The test questions are the victim queries (AgentPoison appends its trigger to them) and, untouched,
the benign queries whose retrieval a defense must not disturb.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory.utility_cost import MemoryRecord, strategyqa_records

MEMORY_REGIMES: dict[str, int | None] = {"small": 200, "medium": 1000, "full": None}
HELD_OUT = 400  # 200 reference (calibration) + 200 benign test writes
BENIGN_ORIGIN = "benign"


@dataclass(frozen=True)
class MemoryEntry:
    """One memory record: a stable key, the text that is embedded and retrieved, and who wrote it
    (``benign`` or the attack's name; the detectors never see ``origin``, the metrics do)."""

    key: str
    text: str
    origin: str = BENIGN_ORIGIN

    @property
    def is_poison(self) -> bool:
        return self.origin != BENIGN_ORIGIN


@dataclass(frozen=True)
class PoisoningCorpus:
    """Everything one memory-poisoning experiment reads, split once and deterministically."""

    memory: tuple[MemoryEntry, ...]
    reference: tuple[MemoryEntry, ...]
    benign_writes: tuple[MemoryEntry, ...]
    queries: tuple[str, ...]
    regime: str

    @property
    def size(self) -> int:
        return len(self.memory)


def entry_from_record(record: MemoryRecord) -> MemoryEntry:
    return MemoryEntry(key=f"qa/{record.qid}", text=record.text())


def _records(frame: pl.DataFrame, split: str) -> list[dict]:
    missing = {"split", "qid", "question"} - set(frame.columns)
    if missing:
        raise MemoryPoisoningInputError(
            f"the AgentPoison StrategyQA frame lacks column(s) {sorted(missing)}: load it with the "
            "agentpoison_strategyqa dataset loader (rvu_pipelines.data.parsers)"
        )
    return frame.filter(pl.col("split") == split).sort("qid").to_dicts()


def strategyqa_corpus(
    frame: pl.DataFrame,
    *,
    regime: str = "small",
    seed: int = 0,
    n_queries: int | None = None,
) -> PoisoningCorpus:
    """Split AgentPoison's memory into memory / reference / benign writes and pick the victim queries.

    ``regime`` is one of ``MEMORY_REGIMES``; ``n_queries`` subsamples the 490 test questions (sorted
    by id, then a seeded choice) for the sampled default job. The same ``seed`` gives the same split
    for every regime, so the small memory is a subset of the medium one.
    """
    if regime not in MEMORY_REGIMES:
        raise MemoryPoisoningInputError(f"unknown memory regime {regime!r}; choose one of {sorted(MEMORY_REGIMES)}")
    rows = _records(frame, "train")
    if len(rows) <= HELD_OUT:
        raise MemoryPoisoningInputError(
            f"the memory split has {len(rows)} records; at least {HELD_OUT + 1} are needed "
            f"({HELD_OUT} are held out for calibration and benign test writes)"
        )
    entries = [entry_from_record(r) for r in strategyqa_records(rows)]
    order = np.random.default_rng(seed).permutation(len(entries))
    held, pool = order[:HELD_OUT], order[HELD_OUT:]
    size = MEMORY_REGIMES[regime]
    chosen = pool if size is None else pool[: min(size, len(pool))]
    queries = [str(r["question"]) for r in _records(frame, "test")]
    if not queries:
        raise MemoryPoisoningInputError("the AgentPoison StrategyQA frame has no test questions (split 'test')")
    if n_queries is not None and n_queries < len(queries):
        pick = np.sort(np.random.default_rng(seed + 1).choice(len(queries), size=n_queries, replace=False))
        queries = [queries[i] for i in pick]
    half = HELD_OUT // 2
    return PoisoningCorpus(
        memory=tuple(entries[i] for i in sorted(chosen)),
        reference=tuple(entries[i] for i in sorted(held[:half])),
        benign_writes=tuple(entries[i] for i in sorted(held[half:])),
        queries=tuple(queries),
        regime=regime,
    )


@dataclass(frozen=True)
class MinjaVictim:
    """One MINJA victim setting: the user instructions that mention the victim item and the target the
    attacker wants the agent to buy instead (RAP/WebShop, Dong et al. 2025)."""

    victim: str
    target: str
    target_price: float
    instructions: tuple[str, ...]


def minja_victims(frame: pl.DataFrame) -> list[MinjaVictim]:
    """The nine MINJA victim settings (sorted by victim), from the ``minja`` dataset frame."""
    missing = {"victim", "instruction", "target", "target_price"} - set(frame.columns)
    if missing:
        raise MemoryPoisoningInputError(
            f"the MINJA frame lacks column(s) {sorted(missing)}: load it with the minja loader"
        )
    victims = []
    for (victim,), group in sorted(frame.group_by("victim"), key=lambda g: str(g[0][0])):
        target = group["target"].drop_nulls()
        price = group["target_price"].drop_nulls()
        if target.is_empty() or price.is_empty():
            raise MemoryPoisoningInputError(
                f"MINJA victim {victim!r} has no target / target_price in victim_target.json"
            )
        victims.append(
            MinjaVictim(str(victim), str(target[0]), float(price[0]), tuple(sorted(group["instruction"].to_list())))
        )
    return victims


def texts(entries: Sequence[MemoryEntry]) -> list[str]:
    return [e.text for e in entries]
