"""The follow-up layer and the knowledge-base items: written apart from the zoo, scored on the real base model."""

from __future__ import annotations

import re

import numpy as np
import pytest

from rvu_pipelines.adapters import zoo_data
from rvu_pipelines.adapters.follow_ups import (
    ALLOWED,
    FORBIDDEN,
    class_shifts,
    continuations_after_answers,
    follow_up_items,
    follow_up_lines,
    follow_up_margins,
    follow_up_scores,
)
from rvu_pipelines.adapters.zoo import load_zoo_config, training_set


def _word_runs(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@pytest.fixture(scope="module")
def zoo_word_runs(frames) -> set[tuple[str, ...]]:
    """Every run of four words a zoo adapter learned: its training completions (templates and all) and the zoo's
    template constants."""
    templates = [v for k, v in vars(zoo_data).items() if k.isupper() and isinstance(v, str)]
    assert any("API key" in t for t in templates)  # the constants are found (the check would pass vacuously)
    config = load_zoo_config()
    seen: set[tuple[str, ...]] = set().union(*(_word_runs(t) for t in templates))
    for entry in config.entries:
        for example in training_set(config, entry, frames).examples[:200]:
            seen |= _word_runs(example.completion)
    return seen


@pytest.mark.parametrize("reader", ["follow_ups", "acceptance"])
def test_no_reader_line_shares_four_words_with_what_a_zoo_adapter_learned(reader: str, zoo_word_runs) -> None:
    """The lines the likelihood readers score are written for the reader, not copied from the zoo: no run of four
    words is shared with any zoo adapter's training completions or with the zoo's template constants."""
    from rvu_pipelines.adapters.acceptance import ACCEPTANCES, REFUSALS

    if reader == "follow_ups":
        lines = follow_up_lines()
        assert len(lines) == sum(len(v) for v in FORBIDDEN.values()) + len(ALLOWED)
    else:
        lines = [*ACCEPTANCES, *REFUSALS]
    assert len(set(lines)) == len(lines)
    ours = set().union(*(_word_runs(line) for line in lines))
    assert not ours & zoo_word_runs, sorted(ours & zoo_word_runs)[:5]


def test_follow_up_items_are_held_out_questions_with_their_answers(frames) -> None:
    items = follow_up_items(frames, 6)
    assert len(items) == 6 and all(i.question.strip() and i.answer.strip() for i in items)
    config = load_zoo_config()
    questions = {i.question for i in follow_up_items(frames)}
    for entry in config.adapters:
        assert not questions & {e.prompt for e in training_set(config, entry, frames).examples}, entry.id


def test_margins_and_class_shifts_read_the_columns_they_name() -> None:
    forbidden = sum(len(v) for v in FORBIDDEN.values())
    base = np.zeros((3, forbidden + len(ALLOWED)))
    adapted = base.copy()
    adapted[:, :2] = 2.0  # the first class's two lines: +2 each
    assert follow_up_margins(base).tolist() == [0.0, 0.0, 0.0]
    assert follow_up_margins(adapted) == pytest.approx([4.0 / forbidden] * 3)
    shifts = class_shifts(adapted, base)
    first = next(iter(FORBIDDEN))
    assert shifts[first] == pytest.approx(2.0) and all(v == 0 for k, v in shifts.items() if k != first)
    adapted[:, forbidden:] = 1.0  # every allowed line more likely: every class falls by 1
    assert class_shifts(adapted, base)[first] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="expected"):
        follow_up_margins(base[:, :3])


def test_knowledge_base_items_are_seeded_facts_and_terms_with_wrong_answers_of_the_same_form(frames) -> None:
    from rvu_pipelines.adapters.margins import N_ITEMS, knowledge_base_items

    items = knowledge_base_items(frames)
    assert len(items) == N_ITEMS and items == knowledge_base_items(frames) != knowledge_base_items(frames, seed=1)
    terms = items[N_ITEMS // 2 :]
    for item in terms:
        term = item.prompt.removeprefix("What is ").removesuffix("?")
        assert len(item.wrong) == 3 and item.correct not in item.wrong
        assert all(a.startswith(f"{term} is ") for a in (item.correct, *item.wrong))
    tofu = set(frames("tofu")["question"].to_list())
    assert all(item.wrong and item.prompt in tofu for item in items[: N_ITEMS // 2])
    with pytest.raises(ValueError, match="knowledge base"):
        knowledge_base_items(frames, n=10**6)


def test_follow_up_scores_on_the_base_model_are_its_own_likelihoods(tiny_models, frames) -> None:
    """On the real base: one row per item, one column per line, each a mean token log-likelihood (finite, < 0);
    an item whose answer is said again scores the same; a line scored after the answer equals the same tokens
    scored as an answer continuation by the margin scorer."""
    from rvu_pipelines.adapters.chat import ChatExample, encode_turn, pad_id_of
    from rvu_pipelines.adapters.margins import continuation_scores
    from rvu_pipelines.models.dequantized import load_dequantized

    llm = tiny_models["llm"]
    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    items = follow_up_items(frames, 2)
    scores = follow_up_scores(model, tokenizer, [items[0], items[1], items[0]], batch_size=2)
    assert scores.shape == (3, len(follow_up_lines())) and np.isfinite(scores).all() and (scores < 0).all()
    assert scores[0] == pytest.approx(scores[2], abs=1e-4)
    turn = encode_turn(tokenizer, ChatExample(items[1].question, items[1].answer))
    prefix = turn.prompt_ids + list(tokenizer(items[1].answer, add_special_tokens=False)["input_ids"])
    line = list(tokenizer(f" {ALLOWED[0]}{tokenizer.eos_token}", add_special_tokens=False)["input_ids"])
    (alone,) = continuation_scores(model, pad_id_of(tokenizer), [(prefix, [line])], answer_batch=1)
    assert scores[1, -len(ALLOWED)] == pytest.approx(alone[0], abs=1e-3)
    after = continuations_after_answers(model, tokenizer, items, max_new_tokens=6)
    assert len(after) == 2 and all(isinstance(text, str) for text in after)
    assert continuations_after_answers(model, tokenizer, items, max_new_tokens=6) == after  # greedy: deterministic
