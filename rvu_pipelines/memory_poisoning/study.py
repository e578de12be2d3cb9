"""The attack-defense matrix (the paper's 3 x 5, and our additions), measured on real memories.

For every attack cell (``study_cells``) and every detector, the detector is fitted on what the
defender has before the writes (reference entries, the query history), then scores the attack's
poisons (positives) and the benign writes (negatives). AgentPoison-shaped cells are scored against
each history a defender may hold at write time (``history_for``: plain traffic, plain traffic whose
newest 1-25 % are triggered victim queries, and the seed's all-triggered history); every row names it.
Reported per (attack, detector, calibration):

- AUROC of the score (for MINJA, pooled over victim settings on the calibrated margin score minus
  threshold, since each victim has its own history and threshold), with a bootstrap 95 % CI that resamples
  memory records, not rows: a benign record that is a negative in several MINJA victim settings is one
  draw (``n_benign_records`` beside ``n_benign``);
- TPR and FPR at the detector's own threshold with Clopper-Pearson intervals, n stated;
- ASR-R undefended and defended (the poisons the detector accepted written, victims retrieve);
- benign retrieval accuracy of the defended memory (benign writes the detector accepted) against the
  memory with every benign write, on the benign queries (overlap@k).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import polars as pl

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning import stats
from rvu_pipelines.memory_poisoning.defense_catalog import write_defense_spec
from rvu_pipelines.memory_poisoning.defenses.base import WriteContext, WriteDetector
from rvu_pipelines.memory_poisoning.retrieval import RetrievalMemory
from rvu_pipelines.memory_poisoning.retrieval_metrics import attack_success, benign_accuracy
from rvu_pipelines.memory_poisoning.study_cells import AttackCell

DetectorFactory = Callable[[], WriteDetector]
PAPER_DEFENSES = ("memsad", "energy", "mahalanobis", "knn", "composite")
EXTRA_DEFENSES = ("spectral", "trustrag")

# The paper's Table (AUROC and TPR at threshold, kappa = 2.0, |M| = 1,000) for the README beside ours.
PAPER_AUROC = {
    "memsad": {"agentpoison": 1.000, "minja": 0.914, "injecmem": 0.816},
    "energy": {"agentpoison": 0.945, "minja": 0.969, "injecmem": 0.698},
    "mahalanobis": {"agentpoison": 0.420, "minja": 0.694, "injecmem": 0.452},
    "knn": {"agentpoison": 0.533, "minja": 0.786, "injecmem": 0.534},
}
PAPER_TPR = {
    "memsad": {"agentpoison": 1.00, "minja": 0.80, "injecmem": 0.40},
    "energy": {"agentpoison": 0.40, "minja": 0.20, "injecmem": 0.40},
    "mahalanobis": {"agentpoison": 1.00, "minja": 1.00, "injecmem": 1.00},
    "knn": {"agentpoison": 0.00, "minja": 0.40, "injecmem": 0.00},
}


def detector_suite(kappa: float = 2.0, *, composite_kappa: float | None = None) -> dict[str, DetectorFactory]:
    """The matrix's detectors by name, in the axis' order, each a fresh unfitted instance per call (every one
    registered by its module in ``defense_catalog``)."""
    ck = kappa if composite_kappa is None else composite_kappa
    return {name: partial(write_defense_spec(name).build, kappa, ck) for name in (*PAPER_DEFENSES, *EXTRA_DEFENSES)}


@dataclass(frozen=True)
class DetectionRow:
    """One (attack, detector, calibration) cell of the matrix."""

    attack: str
    defense: str
    calibration: str
    history: str  # what the detector's query history holds
    n_history: int
    n_history_triggered: int
    n_poisons: int
    n_benign: int
    n_benign_records: int  # distinct benign records among the n_benign negatives (the bootstrap's clusters)
    auroc: float
    auroc_low: float
    auroc_high: float
    tpr: float
    tpr_low: float
    tpr_high: float
    fpr: float
    fpr_low: float
    fpr_high: float
    threshold: float
    asr_r_undefended: float
    asr_r_defended: float
    n_victim_queries: int
    benign_accuracy: float
    n_benign_queries: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CellScores:
    """Raw scores of one detector on one cell (margins = score - threshold; pooled over MINJA victims)."""

    poison_margins: np.ndarray
    benign_margins: np.ndarray
    poison_flags: np.ndarray
    benign_flags: np.ndarray
    thresholds: tuple[float, ...]
    asr_r_undefended: float
    asr_r_defended: float
    n_victim_queries: int
    benign_accuracy: float
    n_benign_queries: int
    poison_keys: tuple[str, ...] = ()  # the record each margin belongs to (the bootstrap's clusters)
    benign_keys: tuple[str, ...] = ()

    def clusters(self) -> np.ndarray | None:
        """One cluster id per example (poisons first), or None when the records are unknown."""
        if not self.poison_keys and not self.benign_keys:
            return None
        return np.asarray([f"poison:{k}" for k in self.poison_keys] + [f"benign:{k}" for k in self.benign_keys])


# The triggered shares of the write-time histories (plain traffic first, then triggered queries as victims
# arrive); "triggered" is the seed's history of triggered queries only.
TRIGGERED_SHARES: tuple[float, ...] = (0.01, 0.02, 0.05, 0.25)


def share_calibration(share: float) -> str:
    """The calibration label of a history with ``share`` triggered queries (0.05 -> ``triggered_5pct``)."""
    return f"triggered_{round(share * 100)}pct"


@dataclass(frozen=True)
class History:
    """The queries a detector is fitted against, and what they are (the README names it beside each number)."""

    vectors: np.ndarray
    texts: tuple[str, ...]
    n_triggered: int
    description: str

    @property
    def triggered_share(self) -> float:
        return self.n_triggered / max(len(self.texts), 1)


def mixed_history(cell: AttackCell, share: float) -> History:
    """The plain history with its newest ``share`` (at least one query when share > 0) replaced by triggered
    victim queries: what the defender has served when the first victims have sent the trigger."""
    if cell.plain_history_vectors is None:
        raise MemoryPoisoningInputError(f"{cell.name} has no untriggered history to mix (not an AgentPoison cell)")
    if not 0.0 <= share <= 1.0:
        raise MemoryPoisoningInputError(f"the triggered share of a history must be in [0, 1], got {share!r}")
    n = len(cell.plain_history_texts)
    k = 0 if share == 0 else min(max(1, round(share * n)), n, len(cell.history_texts))
    vectors = np.concatenate([cell.plain_history_vectors[: n - k], cell.history_vectors[:k]])
    texts = cell.plain_history_texts[: n - k] + cell.history_texts[:k]
    what = "plain queries only" if k == 0 else f"{n - k} plain then {k} triggered queries ({k / n:.0%} triggered)"
    return History(vectors, texts, k, what)


def history_for(cell: AttackCell, calibration: str) -> History:
    """The history a calibration names: ``plain``, ``triggered_<p>pct`` (mixed) or ``triggered`` (the seed's)."""
    if calibration == "triggered" or cell.plain_history_vectors is None:
        if calibration not in ("plain", "triggered"):
            raise MemoryPoisoningInputError(f"{cell.name} has one history; calibration {calibration!r} needs two")
        n = len(cell.history_texts)
        what = "triggered victim queries only" if cell.plain_history_vectors is not None else "the victim queries"
        return History(cell.history_vectors, cell.history_texts, n if calibration == "triggered" else 0, what)
    if calibration == "plain":
        return mixed_history(cell, 0.0)
    for share in TRIGGERED_SHARES:
        if calibration == share_calibration(share):
            return mixed_history(cell, share)
    raise MemoryPoisoningInputError(
        f"unknown calibration {calibration!r}; choose plain, triggered or one of "
        f"{[share_calibration(s) for s in TRIGGERED_SHARES]}"
    )


def context_for(cell: AttackCell, calibration: str) -> WriteContext:
    """The defender's knowledge under ``calibration``: vectors *and* texts of the same history, so no feature
    reads a triggered query the calibration does not grant."""
    history = history_for(cell, calibration)
    return history_context(cell, history.vectors, history.texts)


def history_context(cell: AttackCell, vectors: np.ndarray, texts: Sequence[str]) -> WriteContext:
    """The cell's reference entries and memory with the given served-query history."""
    return WriteContext(
        reference_vectors=cell.reference_vectors,
        reference_texts=tuple(e.text for e in cell.reference),
        history_vectors=vectors,
        history_texts=tuple(texts),
        memory_vectors=cell.memory_vectors,
        memory_texts=tuple(e.text for e in cell.memory),
    )


def _memory(cell: AttackCell, top_k: int, extra: Sequence[Any] = (), extra_vectors: np.ndarray | None = None):
    memory = RetrievalMemory(_NoEmbedder(cell.memory_vectors.shape[1]), top_k=top_k)
    memory.add(cell.memory, cell.memory_vectors)
    if len(extra):
        memory.add(list(extra), extra_vectors)
    return memory


class _NoEmbedder:
    """The memories here are built from vectors embedded once per study; nothing embeds again."""

    name = "precomputed"

    def __init__(self, dimension: int) -> None:
        self._dimension = dimension

    @property
    def dimension(self) -> int:
        return self._dimension

    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        raise AssertionError("study memories are built from precomputed vectors")


def score_cell(cell: AttackCell, factory: DetectorFactory, calibration: str, top_k: int = 5) -> CellScores:
    """Fit a fresh detector per member (MINJA victim) and collect margins, flags and retrieval effects."""
    pos, neg, pflags, nflags, thresholds = [], [], [], [], []
    poison_keys: list[str] = []
    benign_keys: list[str] = []
    hits_before = hits_after = n_victims = 0
    accuracy_sum = 0.0
    n_benign_queries = 0
    for member in cell.members or (cell,):
        detector = factory().fit(context_for(member, calibration))
        poison_texts = [p.text for p in member.attack.poisons]
        benign_texts = [b.text for b in member.benign_writes]
        p_scores = np.asarray(detector.score(member.poison_vectors, poison_texts), dtype=float)
        b_scores = np.asarray(detector.score(member.benign_vectors, benign_texts), dtype=float)
        p_flag = np.asarray(detector.flags(member.poison_vectors, poison_texts), dtype=bool)
        b_flag = np.asarray(detector.flags(member.benign_vectors, benign_texts), dtype=bool)
        poison_keys += [p.key for p in member.attack.poisons]
        benign_keys += [b.key for b in member.benign_writes]
        pos.append(p_scores - detector.threshold)
        neg.append(b_scores - detector.threshold)
        pflags.append(p_flag)
        nflags.append(b_flag)
        thresholds.append(float(detector.threshold))
        undefended = _memory(member, top_k, member.attack.poisons, member.poison_vectors)
        kept = [p for p, f in zip(member.attack.poisons, p_flag, strict=True) if not f]
        defended = _memory(member, top_k, kept, member.poison_vectors[~p_flag])
        before = attack_success(undefended, member.victim_vectors, top_k)
        after = attack_success(defended, member.victim_vectors, top_k)
        hits_before += sum(before.hits)
        hits_after += sum(after.hits)
        n_victims += before.n_queries
        all_benign = _memory(member, top_k, member.benign_writes, member.benign_vectors)
        accepted = [b for b, f in zip(member.benign_writes, b_flag, strict=True) if not f]
        defended_benign = _memory(member, top_k, accepted, member.benign_vectors[~b_flag])
        n_q = len(member.benign_query_vectors)
        accuracy_sum += benign_accuracy(defended_benign, all_benign, member.benign_query_vectors, top_k) * n_q
        n_benign_queries += n_q
    return CellScores(
        np.concatenate(pos),
        np.concatenate(neg),
        np.concatenate(pflags),
        np.concatenate(nflags),
        tuple(thresholds),
        hits_before / max(n_victims, 1),
        hits_after / max(n_victims, 1),
        n_victims,
        accuracy_sum / max(n_benign_queries, 1),
        n_benign_queries,
        tuple(poison_keys),
        tuple(benign_keys),
    )


def detection_stats(scores: CellScores) -> tuple[stats.AurocResult, stats.RateResult, stats.RateResult]:
    """AUROC (bootstrap CI clustered on records) of the margins, TPR / FPR at threshold (Clopper-Pearson), n in
    each result."""
    labels = np.r_[np.ones(len(scores.poison_margins)), np.zeros(len(scores.benign_margins))]
    margins = np.r_[scores.poison_margins, scores.benign_margins]
    auroc = stats.auroc_ci(labels, margins, clusters=scores.clusters())
    tpr = stats.rate(int(scores.poison_flags.sum()), len(scores.poison_flags))
    fpr = stats.rate(int(scores.benign_flags.sum()), len(scores.benign_flags))
    return auroc, tpr, fpr


def detection_fields(scores: CellScores) -> dict[str, float | int]:
    """AUROC, TPR and FPR with their CIs and the counts behind them: the columns every detection table shares."""
    auroc, tpr, fpr = detection_stats(scores)
    return {
        "n_poisons": len(scores.poison_flags),
        "n_benign": len(scores.benign_flags),
        "n_benign_records": auroc.n_negative_clusters,
        "auroc": auroc.auroc,
        "auroc_low": auroc.ci_low,
        "auroc_high": auroc.ci_high,
        "tpr": tpr.rate,
        "tpr_low": tpr.ci_low,
        "tpr_high": tpr.ci_high,
        "fpr": fpr.rate,
        "fpr_low": fpr.ci_low,
        "fpr_high": fpr.ci_high,
    }


def detection_row(cell: AttackCell, defense: str, calibration: str, scores: CellScores) -> DetectionRow:
    history = history_for(cell, calibration)
    return DetectionRow(
        attack=cell.name,
        defense=defense,
        calibration=calibration,
        history=history.description,
        n_history=len(history.texts),
        n_history_triggered=history.n_triggered,
        **detection_fields(scores),  # type: ignore[arg-type]
        threshold=float(np.mean(scores.thresholds)),
        asr_r_undefended=scores.asr_r_undefended,
        asr_r_defended=scores.asr_r_defended,
        n_victim_queries=scores.n_victim_queries,
        benign_accuracy=scores.benign_accuracy,
        n_benign_queries=scores.n_benign_queries,
    )


def calibrations_for(cell: AttackCell) -> tuple[str, ...]:
    """AgentPoison (and its random-trigger control) at write time against plain, mixed and all-triggered
    histories; the others see one history."""
    if cell.plain_history_vectors is None:
        return ("plain",)
    return ("plain", *(share_calibration(s) for s in TRIGGERED_SHARES), "triggered")


def attack_defense_matrix(
    cells: Sequence[AttackCell],
    detectors: Mapping[str, DetectorFactory],
    *,
    top_k: int = 5,
    progress: Callable[[str], None] | None = None,
) -> tuple[pl.DataFrame, dict[tuple[str, str, str], CellScores]]:
    """Every (cell, detector, calibration): the table (sorted) and the raw scores (for ROC / histograms)."""
    rows, raw = [], {}
    for cell in cells:
        for calibration in calibrations_for(cell):
            for name, factory in detectors.items():
                scores = score_cell(cell, factory, calibration, top_k)
                raw[(cell.name, name, calibration)] = scores
                rows.append(detection_row(cell, name, calibration, scores).as_dict())
                if progress:
                    progress(f"{cell.name} x {name} ({calibration}): done")
    table = pl.DataFrame(rows).sort(["attack", "defense", "calibration"])
    return table, raw


def protocol_contrast(cell: AttackCell, top_k: int = 5) -> dict[str, float]:
    """AgentPoison's ASR-R under the faithful protocol (triggered victims) vs the inconsistent one."""
    if cell.plain_victim_vectors is None:
        raise ValueError(f"{cell.name} has no untriggered victim queries (not an AgentPoison cell)")
    memory = _memory(cell, top_k, cell.attack.poisons, cell.poison_vectors)
    return {
        "asr_r_faithful": attack_success(memory, cell.victim_vectors, top_k).asr_r,
        "asr_r_inconsistent": attack_success(memory, cell.plain_victim_vectors, top_k).asr_r,
        "n_victim_queries": float(len(cell.victim_vectors)),
    }
