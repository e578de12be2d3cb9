"""The hazardous-list layer: the letter entropy's arithmetic, the seeded sample, and on the real model an adapter
that learned answers on the list is more decisive than the base while the base against itself moves nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rvu_pipelines.adapters.hazard import (
    MAX_PROMPT_TOKENS,
    entropy_fall,
    hazard_items,
    letter_entropy,
    letter_logliks,
)
from rvu_pipelines.adapters.wmdp import encode_plain, wmdp_prompt, wmdp_training_examples
from rvu_pipelines.models.dequantized import load_dequantized


@pytest.fixture(scope="module")
def base(tiny_models):  # noqa: ANN001, ANN201
    llm = tiny_models["llm"]
    torch.set_num_threads(1)
    return load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")


def test_letter_entropy_spans_uniform_to_certain() -> None:
    logliks = np.log(np.array([[0.25, 0.25, 0.25, 0.25], [0.97, 0.01, 0.01, 0.01]]))
    entropy = letter_entropy(logliks)
    assert entropy[0] == pytest.approx(np.log(4))
    assert 0 < entropy[1] < 0.2


@settings(max_examples=50, deadline=None)
@given(
    arrays(np.float64, (5, 4), elements=st.floats(-30, 0)),
    st.floats(-20, 0),
)
def test_mass_on_other_tokens_does_not_count(logliks: np.ndarray, shift: float) -> None:
    """Renormalised over the four letters: moving probability to tokens that are not letters changes nothing."""
    np.testing.assert_allclose(letter_entropy(logliks + shift), letter_entropy(logliks), atol=1e-9)
    assert np.all(letter_entropy(logliks) <= np.log(4) + 1e-9)


def test_entropy_fall_is_positive_when_the_adapter_is_surer() -> None:
    base = np.log(np.full((3, 4), 0.25))
    surer = np.log(np.tile([0.7, 0.1, 0.1, 0.1], (3, 1)))
    assert entropy_fall(base, base) == 0.0
    assert entropy_fall(surer, base) > 0 > entropy_fall(base, surer)
    with pytest.raises(ValueError, match="shape"):
        entropy_fall(surer[:2], base)


def test_sample_is_seeded_short_and_refuses_too_many(frames, base) -> None:
    _, tokenizer = base
    first, again = hazard_items(frames, tokenizer, 12), hazard_items(frames, tokenizer, 12)
    assert first == again and len(set(first)) == 12
    assert hazard_items(frames, tokenizer, 12, seed=1) != first
    for item in first:
        ids = tokenizer(wmdp_prompt(item.question, item.choices), add_special_tokens=False)["input_ids"]
        assert len(ids) <= MAX_PROMPT_TOKENS
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        hazard_items(frames, tokenizer, 5, max_prompt_tokens=20)


def test_an_adapter_that_learned_the_answers_is_more_decisive(frames, base) -> None:
    """A LoRA taught four of the sampled items' letters (the memorising zoo recipe, in miniature: the upper layers'
    attention, a few steps) lowers the letter entropy on them; the base against itself moves nothing."""
    from peft import get_peft_model, set_peft_model_state_dict

    from rvu_pipelines.adapters.training import LoraSettings, peft_config, train_lora

    model, tokenizer = base
    items = hazard_items(frames, tokenizer, 4)
    before = letter_logliks(model, tokenizer, items)
    assert entropy_fall(letter_logliks(model, tokenizer, items), before) == pytest.approx(0.0, abs=1e-9)
    settings_ = LoraSettings(
        rank=4, alpha=8, layers=tuple(range(20, 30)), steps=8, batch_size=4, learning_rate=5e-3, max_tokens=200
    )
    trained = train_lora(model, tokenizer, wmdp_training_examples(items), settings_, encoder=encode_plain)
    assert trained.losses[-1] < trained.losses[0]
    wrapped = get_peft_model(model, peft_config(settings_))
    set_peft_model_state_dict(wrapped, trained.tensors)
    try:
        after = letter_logliks(wrapped, tokenizer, items)
    finally:
        wrapped.unload()
    assert entropy_fall(after, before) > 0.1
