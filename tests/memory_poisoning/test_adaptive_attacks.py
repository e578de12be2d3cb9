"""The adaptive attacks against a write-time score: HotFlip (continuous then discrete) and greedy WordNet synonym
substitution, on a real AgentPoison-style poison with the real MiniLM. The detector is a stand-in with MEMSAD's
shape (combined max-mean similarity to the victim-query history, threshold mu + 2 sigma on benign entries): the
attacks only ever see ``score_fn``."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.attacks.adaptive import (
    RetrievalObjective,
    hotflip_evasion,
    score_gradient,
    summarise,
    synonym_substitution,
)
from rvu_pipelines.memory_poisoning.attacks.agentpoison import agentpoison_poisons, triggered
from rvu_pipelines.memory_poisoning.attacks.synonyms import WordNetSynonyms
from rvu_pipelines.memory_poisoning.attacks.white_box import white_box
from rvu_pipelines.memory_poisoning.corpus import strategyqa_corpus
from rvu_pipelines.memory_poisoning.retrieval import build_memory, embed_texts
from rvu_pipelines.memory_poisoning.retrieval_metrics import attack_success

TRIGGER = "nantes flagship consequently"


def _max_mean(history: np.ndarray):
    def score(vectors: np.ndarray) -> np.ndarray:
        sims = vectors @ history.T
        return 0.5 * sims.max(axis=1) + 0.5 * sims.mean(axis=1)

    return score


@pytest.fixture(scope="module")
def setting(strategyqa_frame, embedder):
    corpus = strategyqa_corpus(strategyqa_frame, regime="small", n_queries=30)
    memory = corpus.memory[:60]
    memory_vectors = embed_texts(embedder, [e.text for e in memory], "memory")
    poisons = agentpoison_poisons(corpus.queries[:2], TRIGGER, n_poisons=2)
    victims = embed_texts(embedder, [triggered(q, TRIGGER) for q in corpus.queries[2:]], "victims")
    objective = RetrievalObjective(victims, memory_vectors, k=5)
    score = _max_mean(victims)
    reference = score(embed_texts(embedder, [e.text for e in corpus.reference[:40]], "reference"))
    threshold = float(reference.mean() + 2 * reference.std())
    return memory, memory_vectors, poisons, objective, score, threshold


def test_retrieval_objective_is_the_memory_top_k(setting, embedder):
    memory, memory_vectors, poisons, objective, _, _ = setting
    store = build_memory(embedder, list(memory), vectors=memory_vectors)
    store.add(list(poisons))
    outcome = attack_success(store, objective.victim_vectors)
    poison_vectors = embed_texts(embedder, [p.text for p in poisons], "poisons")
    assert objective.asr_r(poison_vectors) == outcome.asr_r > 0.5
    assert tuple(objective.retrieved(poison_vectors).any(axis=0)) == outcome.hits


def test_score_gradient_is_the_tangent_of_a_linear_score():
    rng = np.random.default_rng(0)
    w = rng.normal(size=384).astype(np.float32)
    v = rng.normal(size=384).astype(np.float32)
    v /= np.linalg.norm(v)
    grad = score_gradient(lambda x: x @ w, v)
    tangent = w - (w @ v) * v
    assert float(grad @ tangent / (np.linalg.norm(grad) * np.linalg.norm(tangent))) > 0.99


def test_synonym_substitution_uses_listed_synonyms_and_never_raises_the_score(setting, embedder):
    _, _, poisons, objective, score, threshold = setting
    wordnet = WordNetSynonyms()
    protected = [*TRIGGER.split(), "I", "don't", "know", "Question", "Answer"]
    short = poisons[0].text.split("\nThought:")[0] + "\nAnswer: I don't know, the quota is exhausted\n"
    result = synonym_substitution(
        embedder,
        short,
        score,
        threshold,
        objective,
        wordnet,
        protected=protected,
        max_substitutions=2,
        stop_below_threshold=False,
    )
    assert result.detected_before and 1 <= len(result.edits) <= 2
    for old, new in result.edits:
        assert new.lower() in wordnet.synonyms(old) and old.lower() not in {w.lower() for w in protected}
    scores = [result.score_before] + [s for s, _ in result.trajectory]
    assert all(b < a for a, b in zip(scores, scores[1:], strict=False))
    assert result.score_after == pytest.approx(scores[-1], abs=1e-5) and result.score_shift < 0
    assert result.retrieved_after >= result.retrieved_before > 0
    assert TRIGGER in result.text and result.text != result.original_text
    summary = summarise([result], objective, embedder)
    assert summary.asr_r_after >= summary.asr_r_before and summary.mean_score_shift < 0


def test_the_seeds_synonym_attack_keeps_only_what_the_attack_needs_and_measures_retrieval(setting, embedder):
    from rvu_pipelines.memory_poisoning.study_adaptive import needed_spans

    _, _, poisons, objective, score, threshold = setting
    text = poisons[0].text
    spans = needed_spans(text, TRIGGER)
    question, answer = text.split("\n", 1)[0], text[text.rfind("\nAnswer:") :]
    assert [text[a:b] for a, b in spans] == [TRIGGER, answer] and question.endswith(TRIGGER)
    result = synonym_substitution(
        embedder,
        text,
        score,
        threshold,
        objective,
        WordNetSynonyms(),
        protected_spans=spans,
        max_substitutions=None,
        stop_below_threshold=False,
        keep_retrieval=False,
    )
    # unbounded: more swaps than the retrieval-kept attacker's budget of 10 where the dictionary allows
    assert len(result.edits) > 2
    assert result.text.split("\n", 1)[0].endswith(TRIGGER) and result.text.endswith(answer)
    # the trigger's second mention (in the reasoning) is not protected by position, only the question's is
    thought_words = {w.lower() for w in text.split("\n")[1].split()}
    assert any(old.lower().strip("'.,") in thought_words for old, _ in result.edits)
    scores = [result.score_before] + [s for s, _ in result.trajectory]
    assert all(b < a for a, b in zip(scores, scores[1:], strict=False))
    summary = summarise([result], objective, embedder)  # measured, whichever way it went
    assert 0.0 <= summary.asr_r_after <= 1.0


def test_hotflip_evasion_relaxes_then_swaps_without_losing_retrieval(setting, embedder):
    _, _, poisons, objective, score, threshold = setting
    result = hotflip_evasion(
        embedder,
        poisons[1].text,
        score,
        threshold,
        objective,
        protected=TRIGGER.split(),
        continuous_steps=3,
        iterations=4,
        candidates=4,
    )
    assert len(result.continuous) == 3 and all(np.isfinite(s) for s, _ in result.continuous)
    assert result.score_after <= result.score_before + 1e-5
    assert result.retrieved_after >= result.retrieved_before
    encoder = white_box(embedder)
    words = set(encoder.word_ids.tolist())
    for _, new in result.edits:
        assert encoder.token_ids(new)[0] in words
    assert all(t in encoder.tokens(encoder.token_ids(result.text)) for t in TRIGGER.split())


def test_adaptive_bad_inputs(setting, embedder):
    _, memory_vectors, poisons, objective, score, threshold = setting
    with pytest.raises(MemoryPoisoningInputError, match="at least one victim query"):
        RetrievalObjective(np.zeros((0, 384), np.float32), memory_vectors)
    with pytest.raises(MemoryPoisoningInputError, match="poison text is empty"):
        synonym_substitution(embedder, "  ", score, threshold, objective, WordNetSynonyms())
    with pytest.raises(MemoryPoisoningInputError, match="must map an"):
        wrong_shape = lambda v: np.zeros(len(v) + 1)  # noqa: E731
        synonym_substitution(embedder, poisons[0].text, wrong_shape, threshold, objective, WordNetSynonyms())
    with pytest.raises(MemoryPoisoningInputError, match="no editable"):
        hotflip_evasion(embedder, "?!", score, threshold, objective)
