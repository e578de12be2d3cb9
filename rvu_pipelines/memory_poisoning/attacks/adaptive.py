"""Adaptive attacks on a write-time detector: lower the detector's score, keep the poison retrieved.

Both are generic over the detector: they see it only as ``score_fn(vectors) -> scores`` (higher = more
anomalous; a candidate is flagged when its score exceeds ``threshold``) and never import a defense module.
The retrieval side is :class:`RetrievalObjective`: the victims' query vectors and the benign memory. A poison
is *retrieved* by a victim query when its cosine similarity to the query reaches the query's k-th best benign
similarity (then at most k - 1 benign entries outrank it; exact top-k membership up to ties).

- :func:`hotflip_evasion` (DPR/HotFlip style, white-box on the encoder, black-box on the detector): the
  detector's gradient with respect to the entry's embedding is taken by central finite differences of
  ``score_fn`` on the unit sphere and chained through the encoder by autograd. Continuous phase: a
  perturbation of the input embeddings of the editable tokens is descended on ``score - mu * retrieval``
  (retrieval = mean similarity to the victim queries that retrieved the poison); its trajectory of (score,
  retrieval) is what the coupling argument is about. Discrete phase: HotFlip swaps at the position whose best
  first-order swap promises most, candidates from the first-order gradient and from the vocabulary entries
  nearest to the relaxed embedding, each evaluated exactly; it stops once the entry is no longer flagged.
  A swap is kept only if it lowers the score and, with ``keep_retrieval``, every victim query that retrieved
  the poison still does.
- :func:`synonym_substitution` (the seed's loophole, black-box): greedy word-level substitution from a
  dictionary (:mod:`.synonyms`, WordNet): each step tries every listed synonym of every unprotected, not yet
  substituted word of three or more letters outside a contraction, and applies the one that lowers the score
  most (with ``keep_retrieval``, among those that keep every retrieving victim query); it stops when none
  lowers the score, the budget (if any) is spent, or (``stop_below_threshold``) the entry is no longer
  flagged. The score therefore never rises.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.attacks.synonyms import SynonymSource
from rvu_pipelines.memory_poisoning.attacks.white_box import white_box
from rvu_pipelines.memory_poisoning.retrieval import check_embeddings, embed_texts

ScoreFn = Callable[[np.ndarray], np.ndarray]
_WORD = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class RetrievalObjective:
    """Who must keep retrieving the poison: victim query vectors against the benign memory, top-k."""

    victim_vectors: np.ndarray
    memory_vectors: np.ndarray
    k: int = 5
    kth: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        victims = np.asarray(self.victim_vectors)
        memory = np.asarray(self.memory_vectors)
        if victims.ndim != 2 or victims.shape[0] == 0:
            raise MemoryPoisoningInputError(
                f"the retrieval objective needs at least one victim query vector, got shape {victims.shape}"
            )
        if memory.ndim != 2 or memory.shape[0] == 0:
            raise MemoryPoisoningInputError(
                f"the retrieval objective needs a non-empty memory, got shape {memory.shape}"
            )
        if self.k < 1:
            raise MemoryPoisoningInputError(f"k must be at least 1, got {self.k}")
        d = victims.shape[1]
        victims = check_embeddings(victims, victims.shape[0], d, "victim query vectors")
        memory = check_embeddings(memory, memory.shape[0], d, "memory vectors")
        sims = victims @ memory.T
        k = min(self.k, memory.shape[0])
        object.__setattr__(self, "victim_vectors", victims)
        object.__setattr__(self, "memory_vectors", memory)
        object.__setattr__(self, "kth", np.sort(sims, axis=1)[:, -k])

    @property
    def dimension(self) -> int:
        return int(self.victim_vectors.shape[1])

    def retrieved(self, vectors: np.ndarray) -> np.ndarray:
        """(n_candidates, n_victims) bool: which victim queries would retrieve each candidate."""
        return np.asarray(vectors, dtype=np.float32) @ self.victim_vectors.T >= self.kth[None, :]

    def asr_r(self, poison_vectors: np.ndarray) -> float:
        """ASR-R of a set of poisons written together: victims whose best poison reaches their top-k."""
        if len(poison_vectors) == 0:
            return 0.0
        return float(self.retrieved(poison_vectors).any(axis=0).mean())


@dataclass(frozen=True)
class EvasionResult:
    """One poison before and after an adaptive attack."""

    method: str
    original_text: str
    text: str
    score_before: float
    score_after: float
    threshold: float
    retrieved_before: int  # victim queries that retrieve it
    retrieved_after: int
    n_victims: int
    edits: tuple[tuple[str, str], ...]
    trajectory: tuple[tuple[float, int], ...]  # (score, retrieved) after each accepted edit / step
    continuous: tuple[tuple[float, int], ...] = ()  # the relaxed phase's (score, retrieved) per step

    @property
    def detected_before(self) -> bool:
        return self.score_before > self.threshold

    @property
    def detected_after(self) -> bool:
        return self.score_after > self.threshold

    @property
    def score_shift(self) -> float:
        return self.score_after - self.score_before

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "score_before": self.score_before,
            "score_after": self.score_after,
            "score_shift": self.score_shift,
            "threshold": self.threshold,
            "detected_before": self.detected_before,
            "detected_after": self.detected_after,
            "retrieved_before": self.retrieved_before,
            "retrieved_after": self.retrieved_after,
            "n_victims": self.n_victims,
            "n_edits": len(self.edits),
        }


@dataclass(frozen=True)
class AdaptiveSummary:
    """An adaptive attack over a set of poisons written together: ASR-R and detection before / after."""

    method: str
    n_poisons: int
    asr_r_before: float
    asr_r_after: float
    detected_before: int
    detected_after: int
    mean_score_shift: float

    @property
    def delta_asr_r(self) -> float:
        return self.asr_r_after - self.asr_r_before

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "delta_asr_r": self.delta_asr_r}


def summarise(
    results: Sequence[EvasionResult], objective: RetrievalObjective, embedder: Any, threshold: float | None = None
) -> AdaptiveSummary:
    """ASR-R of all poisons together before and after, how many stay flagged, the mean score shift."""
    if not results:
        raise MemoryPoisoningInputError("no evasion results to summarise")
    before = embed_texts(embedder, [r.original_text for r in results], "poisons before")
    after = embed_texts(embedder, [r.text for r in results], "poisons after")
    limit = results[0].threshold if threshold is None else threshold
    return AdaptiveSummary(
        method=results[0].method,
        n_poisons=len(results),
        asr_r_before=objective.asr_r(before),
        asr_r_after=objective.asr_r(after),
        detected_before=sum(r.score_before > limit for r in results),
        detected_after=sum(r.score_after > limit for r in results),
        mean_score_shift=float(np.mean([r.score_shift for r in results])),
    )


def _scores(score_fn: ScoreFn, vectors: np.ndarray) -> np.ndarray:
    scores = np.asarray(score_fn(np.ascontiguousarray(vectors, dtype=np.float32)), dtype=np.float64).reshape(-1)
    if scores.shape[0] != len(vectors) or not np.isfinite(scores).all():
        raise MemoryPoisoningInputError(
            f"score_fn returned {scores.shape[0]} scores for {len(vectors)} vectors (or non-finite ones): it must "
            "map an (n, d) matrix of unit rows to n finite scores"
        )
    return scores


def score_gradient(score_fn: ScoreFn, vector: np.ndarray, *, step: float = 5e-3) -> np.ndarray:
    """d score / d embedding at a unit vector, by central differences along each axis (renormalised)."""
    v = np.asarray(vector, dtype=np.float64).reshape(-1)
    eye = np.eye(v.size) * step
    plus, minus = v + eye, v - eye
    plus /= np.linalg.norm(plus, axis=1, keepdims=True)
    minus /= np.linalg.norm(minus, axis=1, keepdims=True)
    scores = _scores(score_fn, np.concatenate([plus, minus]).astype(np.float32))
    return ((scores[: v.size] - scores[v.size :]) / (2 * step)).astype(np.float32)


def _keeps(retrieved: np.ndarray, required: np.ndarray) -> np.ndarray:
    """Rows of ``retrieved`` that still cover every victim in ``required``."""
    return (retrieved | ~required[None, :]).all(axis=1)


def _finish(
    method: str,
    original: str,
    text: str,
    start: tuple[float, int],
    threshold: float,
    embedder: Any,
    score_fn: ScoreFn,
    objective: RetrievalObjective,
    edits: Sequence[Any],
    trajectory: Sequence[tuple[float, int]],
    continuous: Sequence[tuple[float, int]] = (),
) -> EvasionResult:
    """Re-embed the final text and record where it ends: the detector's score and the victims still reached."""
    final = embed_texts(embedder, [text], "poison after")
    return EvasionResult(
        method=method,
        original_text=original,
        text=text,
        score_before=start[0],
        score_after=float(_scores(score_fn, final)[0]),
        threshold=float(threshold),
        retrieved_before=start[1],
        retrieved_after=int(objective.retrieved(final)[0].sum()),
        n_victims=len(objective.kth),
        edits=tuple(edits),
        trajectory=tuple(trajectory),
        continuous=tuple(continuous),
    )


def synonym_substitution(
    embedder: Any,
    text: str,
    score_fn: ScoreFn,
    threshold: float,
    objective: RetrievalObjective,
    synonyms: SynonymSource,
    *,
    protected: Collection[str] = (),
    protected_spans: Sequence[tuple[int, int]] = (),
    max_substitutions: int | None = 10,
    stop_below_threshold: bool = True,
    keep_retrieval: bool = True,
) -> EvasionResult:
    """Greedy word-level synonym substitution (see module docstring). ``protected`` words are kept wherever they
    occur, ``protected_spans`` (character ranges of ``text``) where they are; ``max_substitutions=None`` lets
    the search run until no swap lowers the score; ``keep_retrieval=False`` drops the constraint that every
    retrieving victim keeps retrieving the poison, so the ASR-R change is measured rather than enforced."""
    if not text.strip():
        raise MemoryPoisoningInputError("synonym substitution: the poison text is empty")
    keep = {w.lower() for p in protected for w in _WORD.findall(p)}
    spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    # words of 3+ letters outside contractions ("don't" stays whole) and not protected may be substituted
    fixed = {
        i
        for i, (a, b) in enumerate(spans)
        if b - a < 3
        or text[a:b].lower() in keep
        or _in_contraction(text, a, b)
        or any(a < end and start < b for start, end in protected_spans)
    }
    vector = embed_texts(embedder, [text], "poison")
    score = float(_scores(score_fn, vector)[0])
    required = objective.retrieved(vector)[0]
    start_score, start_count = score, int(required.sum())
    current = text
    words = [text[a:b] for a, b in spans]
    used: set[int] = set()
    edits: list[tuple[str, str]] = []
    trajectory: list[tuple[float, int]] = []
    budget = len(spans) if max_substitutions is None else max_substitutions
    while len(edits) < budget and not (stop_below_threshold and score <= threshold):
        options = [
            (i, s)
            for i, w in enumerate(words)
            if i not in used and i not in fixed
            for s in synonyms.synonyms(w)
            if s != w.lower()
        ]
        if not options:
            break
        texts = [_replace(current, spans, i, _match_case(s, words[i])) for i, s in options]
        vectors = embed_texts(embedder, texts, "synonym candidates")
        scores = _scores(score_fn, vectors)
        if keep_retrieval:
            scores = np.where(_keeps(objective.retrieved(vectors), required), scores, np.inf)
        best = int(np.argmin(scores))
        if not scores[best] < score:
            break
        i, s = options[best]
        new = _match_case(s, words[i])
        edits.append((words[i], new))
        current, spans, words = texts[best], *_respan(spans, words, i, new)
        used.add(i)
        score = float(scores[best])
        trajectory.append((score, int(objective.retrieved(vectors[best : best + 1])[0].sum())))
    return _finish(
        "synonym_substitution", text, current, (start_score, start_count), threshold, embedder, score_fn, objective,
        edits, trajectory,
    )  # fmt: skip


def _in_contraction(text: str, start: int, end: int) -> bool:
    return (start > 0 and text[start - 1] in "'’") or (end < len(text) and text[end] in "'’")


def _match_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    return word.capitalize() if like[:1].isupper() else word


def _replace(text: str, spans: list[tuple[int, int]], i: int, new: str) -> str:
    a, b = spans[i]
    return text[:a] + new + text[b:]


def _respan(
    spans: list[tuple[int, int]], words: list[str], i: int, new: str
) -> tuple[list[tuple[int, int]], list[str]]:
    shift = len(new) - (spans[i][1] - spans[i][0])
    out = [
        (a, b) if j < i else ((a, a + len(new)) if j == i else (a + shift, b + shift)) for j, (a, b) in enumerate(spans)
    ]
    return out, [new if j == i else w for j, w in enumerate(words)]


def _best_position(encoder: Any, ids: Sequence[int], grad: torch.Tensor, positions: Sequence[int]) -> int:
    """The position whose best first-order swap promises the largest decrease (HotFlip's choice)."""
    import torch

    table = encoder.word_embeddings[torch.from_numpy(encoder.word_ids)]
    rows = torch.stack([grad[p + 1] for p in positions])
    current = torch.stack([encoder.word_embeddings[ids[p]] @ grad[p + 1] for p in positions])
    gains = (rows @ table.T).min(dim=1).values - current
    return int(positions[int(torch.argmin(gains))])


def hotflip_evasion(
    embedder: Any,
    text: str,
    score_fn: ScoreFn,
    threshold: float,
    objective: RetrievalObjective,
    *,
    protected: Collection[str] = (),
    continuous_steps: int = 20,
    learning_rate: float = 0.05,
    retrieval_weight: float = 1.0,
    iterations: int = 12,
    candidates: int = 8,
    keep_retrieval: bool = True,
) -> EvasionResult:
    """Continuous-then-discrete HotFlip on the poison's own tokens (see module docstring)."""
    import torch

    if not text.strip():
        raise MemoryPoisoningInputError("HotFlip evasion: the poison text is empty")
    encoder = white_box(embedder)
    ids = encoder.token_ids(text)
    words = set(encoder.word_ids.tolist())
    keep = {t for w in protected for t in encoder.token_ids(w)}
    editable = [p for p, t in enumerate(ids) if t in words and t not in keep]
    if not editable:
        raise MemoryPoisoningInputError("HotFlip evasion: the poison has no editable whole-word token")
    vector = encoder.embed_ids([ids])
    score = float(_scores(score_fn, vector)[0])
    required = objective.retrieved(vector)[0]
    start_score, start_count = score, int(required.sum())
    targets = torch.from_numpy(objective.victim_vectors[required] if required.any() else objective.victim_vectors)

    def surrogate(grad_score: np.ndarray) -> Callable[[torch.Tensor], torch.Tensor]:
        g = torch.from_numpy(grad_score)

        def loss(e: torch.Tensor) -> torch.Tensor:
            return (e[0] * g).sum() - retrieval_weight * (targets @ e[0]).mean()

        return loss

    # continuous phase: relax the editable tokens' input embeddings
    delta = {p: torch.zeros(encoder.word_embeddings.shape[1]) for p in editable}
    moment = {p: torch.zeros_like(d) for p, d in delta.items()}
    continuous: list[tuple[float, int]] = []
    current = vector
    for _ in range(continuous_steps):
        g_score = score_gradient(score_fn, current[0])
        _, grad = encoder.gradients([ids], surrogate(g_score), inputs_delta=delta)
        for p in editable:
            moment[p] = 0.9 * moment[p] + grad[0, p + 1]
            delta[p] = delta[p] - learning_rate * moment[p] / (moment[p].norm() + 1e-8)
        current = encoder.embed_relaxed(ids, delta)
        continuous.append((float(_scores(score_fn, current)[0]), int(objective.retrieved(current)[0].sum())))

    # discrete phase: HotFlip swaps, evaluated exactly
    ids = list(ids)
    edits: list[tuple[str, str]] = []
    trajectory: list[tuple[float, int]] = []
    vector = encoder.embed_ids([ids])
    tried: set[int] = set()
    for _ in range(iterations):
        if score <= threshold or len(tried) == len(editable):
            break
        _, grad = encoder.gradients([ids], surrogate(score_gradient(score_fn, vector[0])))
        position = _best_position(encoder, ids, grad[0], [p for p in editable if p not in tried])
        tried.add(position)
        relaxed = encoder.word_embeddings[ids[position]] + delta[position]
        half = max(1, candidates // 2)
        pool = encoder.hotflip(grad[0, position + 1], half, exclude=[ids[position]])
        pool += [t for t in encoder.nearest_words(relaxed, half + 1) if t not in pool and t != ids[position]][:half]
        rows = [ids[:position] + [t] + ids[position + 1 :] for t in pool]
        vectors = encoder.embed_ids(rows)
        scores = _scores(score_fn, vectors)
        if keep_retrieval:
            scores = np.where(_keeps(objective.retrieved(vectors), required), scores, np.inf)
        best = int(np.argmin(scores))
        if scores[best] < score:
            edits.append((encoder.tokens([ids[position]])[0], encoder.tokens([pool[best]])[0]))
            ids = rows[best]
            vector = vectors[best : best + 1]
            score = float(scores[best])
            trajectory.append((score, int(objective.retrieved(vector)[0].sum())))
            tried.clear()
    final_text = text if not edits else encoder.tokenizer.decode(ids)
    return _finish(
        "hotflip_evasion", text, final_text, (start_score, start_count), threshold, embedder, score_fn, objective,
        edits, trajectory, continuous,
    )  # fmt: skip
