"""The adaptive attacks against MEMSAD and the hybrid check that answers the synonym loophole.

``adaptive_study`` takes an attack cell, fits MEMSAD the way the defender would, and lets the two
adaptive attackers rewrite each poison against it (white-box access to the detector's score, which
is the paper's adaptive threat model): DPR/HotFlip-style optimisation and greedy word-level synonym
substitution (WordNet synonyms). ``synonym`` is the seed's construction: only what the attack needs is
kept verbatim (``needed_spans``), no substitution budget, and the ASR-R change measured by retrieval
afterwards; ``synonym_retrieval_kept`` is the stricter attacker that keeps every retrieving victim and
stops at 10 swaps. Reported: ASR-R before and after (all poisons written together),
how many poisons MEMSAD still flags, and the mean score shift; then the hybrid discrete check is
fitted on benign data only and scores the rewritten poisons against the benign writes (TPR / FPR at
its threshold, AUROC) and its cost in benign retrieval accuracy, under the attack's history and under
the plain one (``hybrid_plain``: served queries without the trigger, so its trigger feature has nothing
to find).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.attacks.adaptive import (
    AdaptiveSummary,
    EvasionResult,
    RetrievalObjective,
    hotflip_evasion,
    summarise,
    synonym_substitution,
)
from rvu_pipelines.memory_poisoning.attacks.synonyms import WordNetSynonyms
from rvu_pipelines.memory_poisoning.defenses.base import WriteDetector
from rvu_pipelines.memory_poisoning.defenses.memsad import MemsadDetector
from rvu_pipelines.memory_poisoning.retrieval import embed_texts
from rvu_pipelines.memory_poisoning.study import context_for, detection_fields, score_cell
from rvu_pipelines.memory_poisoning.study_cells import AttackCell
from rvu_pipelines.models.embedding import Embedder


@dataclass(frozen=True)
class AdaptiveResult:
    """One adaptive attack against MEMSAD, and the hybrid check on its output."""

    method: str
    summary: AdaptiveSummary
    memsad_threshold: float
    hybrid: dict[str, Any] = field(default_factory=dict)
    texts: tuple[str, ...] = ()
    hybrid_plain: dict[str, Any] = field(default_factory=dict)  # the hybrid against a history without the trigger

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            **self.summary.as_dict(),
            "memsad_threshold": self.memsad_threshold,
            **{f"hybrid_{k}": v for k, v in self.hybrid.items()},
            **{f"hybrid_plain_{k}": v for k, v in self.hybrid_plain.items()},
        }


METHODS = ("synonym", "synonym_retrieval_kept", "hotflip")


def protected_words(cell: AttackCell) -> tuple[str, ...]:
    """The trigger's words, kept wherever they occur (the retrieval-kept contrast and HotFlip)."""
    words = set((cell.attack.trigger or "").split())
    return tuple(sorted(words))


def needed_spans(text: str, trigger: str | None) -> list[tuple[int, int]]:
    """What the attack needs verbatim, and nothing else: the trigger where the question carries it (the victims'
    queries end with it) and the answer line (the malicious action). The trigger's mention in the reasoning,
    the question's own words and the reasoning may all be rewritten."""
    spans = []
    first = text.split("\n", 1)[0]
    if trigger and (at := first.rfind(trigger)) >= 0:
        spans.append((at, at + len(trigger)))
    if (answer := text.rfind("\nAnswer:")) >= 0:
        spans.append((answer, len(text)))
    return spans


def adaptive_study(
    cell: AttackCell,
    embedder: Embedder,
    hybrid_factory: Callable[[], WriteDetector] | None,
    *,
    kappa: float = 2.0,
    calibration: str = "triggered",
    top_k: int = 5,
    max_poisons: int | None = None,
    methods: tuple[str, ...] = ("synonym", "hotflip"),
    progress: Callable[[str], None] | None = None,
) -> list[AdaptiveResult]:
    """Run the adaptive attacks of ``methods`` against MEMSAD on ``cell`` and the hybrid on their output."""
    context = context_for(cell, calibration)
    memsad = MemsadDetector(kappa).fit(context)
    objective = RetrievalObjective(cell.victim_vectors, cell.memory_vectors, k=top_k)
    poisons = cell.attack.poisons[:max_poisons] if max_poisons else cell.attack.poisons

    def score_fn(vectors: np.ndarray) -> np.ndarray:
        return np.asarray(memsad.score(vectors, []), dtype=float)

    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise MemoryPoisoningInputError(f"unknown adaptive method(s) {unknown}; choose from {METHODS}")
    synonyms = WordNetSynonyms() if any(m.startswith("synonym") for m in methods) else None
    keep = protected_words(cell)
    out = []
    for method in methods:
        results: list[EvasionResult] = []
        for i, poison in enumerate(poisons):
            if method == "synonym":  # as the seed ran it: no budget, retrieval measured afterwards, not enforced
                assert synonyms is not None
                result = synonym_substitution(
                    embedder,
                    poison.text,
                    score_fn,
                    memsad.threshold,
                    objective,
                    synonyms,
                    protected_spans=needed_spans(poison.text, cell.attack.trigger),
                    max_substitutions=None,
                    keep_retrieval=False,
                )
            elif method == "synonym_retrieval_kept":  # the stricter attacker: every retrieving victim kept, <= 10 swaps
                assert synonyms is not None
                result = synonym_substitution(
                    embedder, poison.text, score_fn, memsad.threshold, objective, synonyms, protected=keep
                )
            elif method == "hotflip":
                result = hotflip_evasion(embedder, poison.text, score_fn, memsad.threshold, objective, protected=keep)
            else:
                raise ValueError(f"unknown adaptive method {method!r}")
            results.append(result)
            if progress:
                progress(
                    f"{method}: poison {i + 1}/{len(poisons)} score {result.score_before:.3f} -> "
                    f"{result.score_after:.3f}"
                )
        summary = summarise(results, objective, embedder, memsad.threshold)
        texts = tuple(r.text for r in results)
        hybrid = plain = {}
        if hybrid_factory is not None:
            hybrid = hybrid_on(cell, texts, embedder, hybrid_factory, calibration, top_k)
            if calibration != "plain":  # does it catch the rewrite without reading the trigger in served queries?
                plain = hybrid_on(cell, texts, embedder, hybrid_factory, "plain", top_k)
        out.append(AdaptiveResult(method, summary, float(memsad.threshold), hybrid, texts, plain))
    return out


def hybrid_on(
    cell: AttackCell,
    rewritten: tuple[str, ...],
    embedder: Embedder,
    factory: Callable[[], WriteDetector],
    calibration: str,
    top_k: int,
) -> dict[str, Any]:
    """The hybrid check against the rewritten poisons: TPR / FPR at threshold, AUROC, benign accuracy."""
    from dataclasses import replace

    from rvu_pipelines.memory_poisoning.corpus import MemoryEntry

    poisons = tuple(
        MemoryEntry(f"{p.key}/rewritten", text, p.origin)
        for p, text in zip(cell.attack.poisons[: len(rewritten)], rewritten, strict=True)
    )
    rewritten_cell = replace(
        cell,
        attack=replace(cell.attack, poisons=poisons),
        poison_vectors=embed_texts(embedder, list(rewritten), "rewritten poisons"),
        members=(),
    )
    scores = score_cell(rewritten_cell, factory, calibration, top_k)
    return {
        **detection_fields(scores),
        "asr_r_defended": scores.asr_r_defended,
        "benign_accuracy": scores.benign_accuracy,
        "benign_accuracy_drop_points": 100 * (1 - scores.benign_accuracy),
    }
