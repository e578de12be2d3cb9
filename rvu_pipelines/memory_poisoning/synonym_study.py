"""The synonym loophole as the seed ran it: n AgentPoison poisons (60 by default), greedy WordNet substitution
against MEMSAD with no budget and only what the attack needs kept verbatim, the ASR-R change measured by retrieval;
beside it the stricter attacker that keeps every retrieving victim, and the hybrid check with and without the
trigger in the served queries.

Threat model: the attacker has write access, the white-box encoder and MEMSAD's score (the seed's adaptive
adversary); MEMSAD is calibrated against the seed's history of triggered victim queries, the one setting in which
it flags the unmodified poisons; the hybrid's κ is chosen on benign data only. Writes ``synonym_study.md`` and
``synonym_study.json`` (stamped) into the output folder. The ``memory_poisoning_synonym`` asset runs it
(``make memsad-synonym``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.corpus import MEMORY_REGIMES
from rvu_pipelines.models.embedding import Embedder

SYNONYM_METHODS = ("synonym", "synonym_retrieval_kept")


@dataclass(frozen=True)
class SynonymStudyOptions:
    """``poisons``: AgentPoison poisons (and training questions); ``methods``: the substitution attackers."""

    poisons: int = 60
    regime: str = "medium"
    methods: tuple[str, ...] = SYNONYM_METHODS

    def __post_init__(self) -> None:
        if self.regime not in MEMORY_REGIMES:
            raise MemoryPoisoningInputError(f"regime {self.regime!r} is not one of: {', '.join(MEMORY_REGIMES)}")
        unknown = sorted(set(self.methods) - set(SYNONYM_METHODS))
        if unknown or not self.methods:
            raise MemoryPoisoningInputError(f"methods {unknown or '[]'}: choose from {', '.join(SYNONYM_METHODS)}")
        if self.poisons < 2:
            raise MemoryPoisoningInputError(f"poisons {self.poisons}: the study needs at least 2")


def synonym_markdown(results: list[Any], header: str) -> str:
    """One row per attacker: ASR-R and MEMSAD's flags before and after, the hybrid's TPR / FPR on both histories."""
    lines = [
        header,
        "",
        "| attack | n | ASR-R before -> after | MEMSAD flags before -> after | hybrid TPR [95% CI] / FPR "
        "(triggered history) | hybrid TPR [95% CI] / FPR (plain history) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        s, h, p = r.summary, r.hybrid, r.hybrid_plain
        lines.append(
            f"| {r.method} | {s.n_poisons} | {s.asr_r_before:.2f} -> {s.asr_r_after:.2f} | {s.detected_before} -> "
            f"{s.detected_after} | {h['tpr']:.2f} [{h['tpr_low']:.2f}, {h['tpr_high']:.2f}] / {h['fpr']:.3f} | "
            f"{p['tpr']:.2f} [{p['tpr_low']:.2f}, {p['tpr_high']:.2f}] / {p['fpr']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def run_synonym_study(
    options: SynonymStudyOptions,
    frames: Mapping[str, pl.DataFrame],
    embedder: Embedder,
    out: Path,
    *,
    command: str,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The study into ``out`` (``frames``: the data sets by catalog name, AgentPoison's StrategyQA at least);
    returns the document written to ``synonym_study.json``."""
    from rvu_pipelines.machine import results_stamp, stamp_line
    from rvu_pipelines.memory_poisoning.runner import benign_hybrid_kappa, hybrid_factory
    from rvu_pipelines.memory_poisoning.study_adaptive import adaptive_study
    from rvu_pipelines.memory_poisoning.study_cells import EmbeddingCache, StudyConfig, build_cell

    config = StudyConfig(regime=options.regime, agentpoison_poisons=options.poisons, agentpoison_train=options.poisons)
    stamp = results_stamp(command)
    started = time.perf_counter()
    cell = build_cell("agentpoison", frames, EmbeddingCache(embedder), config)
    kappa = benign_hybrid_kappa(cell, None)
    results = adaptive_study(
        cell,
        embedder,
        hybrid_factory(None, kappa.kappa),
        kappa=config.kappa,
        top_k=config.top_k,
        methods=options.methods,
        progress=say,
    )
    header = (
        f"Synonym study: {len(cell.attack.poisons)} AgentPoison poisons, |M| = {len(cell.memory)}, MEMSAD kappa "
        f"{config.kappa:g} on the triggered history; hybrid kappa {kappa.kappa:g} from benign data "
        f"(5-fold FPR {kappa.cv_fpr:.3f}); {time.perf_counter() - started:.0f} s. {stamp_line(stamp)}"
    )
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "synonym_study.md", synonym_markdown(list(results), header))
    document = {"stamp": stamp, "hybrid_kappa": kappa.as_dict(), "results": [r.as_dict() for r in results]}
    write_atomically(out / "synonym_study.json", json.dumps(document, indent=1, sort_keys=True, default=str))
    return document
