"""AgentPoison with poisons that are not templated: real content in the memory's own format.

AgentPoison's released poisons share one payload and one reasoning line ("there is '<trigger>' in the
question, which means we are running out of action quota..."), so anything that spots the template (a
ROUGE cluster, a Mahalanobis distance, a near-duplicate filter) separates them without reading the query
stream. An attacker who copies the memory's format leaves no such template. Each varied poison is

    Question: <an attacker-known question> <trigger>
    Search[<term>]: <description>
    Answer: <payload>

exactly the shape of the benign ReAct-StrategyQA records: the ``Search`` line is a real record's (the public
StrategyQA memory record whose question shares most content words with this one, as an attacker with the
public data would pick), and the payloads alternate between a real InjecAgent attacker instruction (the
malicious action, one per poison, drawn without replacement) and misinformation (that record's answer
flipped). The trigger appears once, where the victims' queries carry it; the optimised trigger, the split
and the victim queries are AgentPoison's own, so ASR-R and every detector are measured on the same protocol.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.attack_catalog import poisoning_attack
from rvu_pipelines.memory_poisoning.attacks.agentpoison import agentpoison_run, triggered, triggered_cell
from rvu_pipelines.memory_poisoning.attacks.base import AttackRun
from rvu_pipelines.memory_poisoning.corpus import MemoryEntry, strategyqa_corpus

if TYPE_CHECKING:
    from collections.abc import Mapping

    import polars as pl

    from rvu_pipelines.memory_poisoning.study_cells import AttackCell, EmbeddingCache, StudyConfig

NAME = "agentpoison_varied"
_WORD = re.compile(r"[a-z0-9]+")
_MIN_WORD = 4  # content words: shorter ones are mostly function words


@dataclass(frozen=True)
class SourceRecord:
    """A public memory record the attacker copies a search line from."""

    qid: str
    question: str
    term: str
    description: str
    answer: str


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) >= _MIN_WORD}


def nearest_source(
    question: str, sources: Sequence[SourceRecord], order: Sequence[int], used: set[str]
) -> SourceRecord:
    """The unused source whose question shares most content words with ``question``; ties go to the earlier
    source in ``order`` (a seeded permutation), so questions with no overlap do not all copy one record."""
    wanted = _words(question)
    rank = {i: position for position, i in enumerate(order)}
    best = max(
        (i for i in range(len(sources)) if sources[i].qid not in used),
        key=lambda i: (len(wanted & _words(sources[i].question)), -rank[i]),
    )
    return sources[best]


def _flipped(answer: str) -> str:
    low = answer.strip().lower()
    if low in ("true", "yes"):
        return "False"
    if low in ("false", "no"):
        return "True"
    return f"not {answer.strip()}"


def varied_record(question: str, trigger: str, source: SourceRecord, payload: str) -> str:
    return f"Question: {triggered(question, trigger)}\nSearch[{source.term}]: {source.description}\nAnswer: {payload}\n"


def varied_attack(run: AttackRun, sources: Sequence[SourceRecord], instructions: Sequence[str], seed: int) -> AttackRun:
    """``run``'s poisons rewritten as varied real-content records (same trigger, victims and protocol)."""
    if not run.trigger:
        raise MemoryPoisoningInputError(f"attack run {run.name!r} has no trigger: vary an AgentPoison run")
    usable = [s for s in sources if s.term.strip() and s.description.strip()]
    if not usable:
        raise MemoryPoisoningInputError("no source record has a search term and description to copy")
    train = list(run.details.get("train_queries") or ())
    n = len(run.poisons)
    if len(train) < n:
        raise MemoryPoisoningInputError(f"{n} poisons need {n} attacker-known questions, the run has {len(train)}")
    n_instructions = (n + 1) // 2
    if len(instructions) < n_instructions:
        raise MemoryPoisoningInputError(f"{n} varied poisons need {n_instructions} attacker instructions")
    if len({s.qid for s in usable}) < n:
        raise MemoryPoisoningInputError(f"{n} varied poisons need {n} distinct source records, {len(usable)} given")
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(instructions), size=n_instructions, replace=False)
    chosen = [instructions[i].strip() for i in sorted(picked.tolist())]
    usable = sorted(usable, key=lambda s: s.qid)
    order = rng.permutation(len(usable)).tolist()
    used: set[str] = set()
    poisons = []
    for i, question in enumerate(train[:n]):
        source = nearest_source(question, usable, order, used)
        used.add(source.qid)
        payload = chosen[i // 2] if i % 2 == 0 else _flipped(source.answer)
        text = varied_record(question, run.trigger, source, payload)
        poisons.append(MemoryEntry(key=f"{NAME}/{i}", text=text, origin=NAME))
    details = {**run.details, "poisons": "varied: real search lines, InjecAgent instructions / flipped answers"}
    return replace(run, name=NAME, poisons=tuple(poisons), details=details)


@poisoning_attack(NAME, label="AP-varied")
def varied_cell(frames: Mapping[str, pl.DataFrame], embed: EmbeddingCache, config: StudyConfig) -> AttackCell:
    """AgentPoison's trigger, split and victims; poisons of real content in the memory's format."""
    import polars as pl

    from rvu_pipelines.memory_poisoning.attacks.injecmem import injecagent_payloads
    from rvu_pipelines.memory_poisoning.study_cells import frame_named

    strategyqa = frame_named(frames, "agentpoison_strategyqa")
    corpus = strategyqa_corpus(strategyqa, regime=config.regime, seed=config.seed, n_queries=config.n_queries)
    sources = [
        SourceRecord(str(r["qid"]), str(r["question"]), str(r["term"]), str(r["description"]), str(r["answer"]))
        for r in strategyqa.filter(pl.col("split") == "train").drop_nulls(["term", "description"]).to_dicts()
    ]
    instructions = injecagent_payloads(frame_named(frames, "injecagent"))
    run = varied_attack(agentpoison_run(embed, corpus, config), sources, instructions, seed=config.seed)
    return triggered_cell(embed, run, corpus)
