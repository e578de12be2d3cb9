"""E6 membership scores: Min-K %++ against a hand computation, score orientation, and a real check that can
fail: an adapter trained on 8 TOFU forget answers must make those 8 separable from 8 held-out ones."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.membership import (
    PROBES,
    TokenStats,
    leak_recall,
    loss_score,
    membership_auroc,
    membership_report,
    membership_scores,
    min_k_plus_plus_score,
    min_k_score,
    next_token_stats,
    run_probes,
    split_members,
    token_logprobs,
)
from rvu_pipelines.adapters.training import LoraSettings, peft_config, train_lora
from rvu_pipelines.models.dequantized import load_dequantized

# 8 steps (8 passes over the 8 members) already take the answer loss from 2.3 to 0.8: AUROC 1.0 at lower cost.
SETTINGS = LoraSettings(rank=8, alpha=16, steps=8, batch_size=8, learning_rate=3e-3, seed=0)


def test_min_k_plus_plus_matches_hand_computation() -> None:
    a = math.log(2.0)
    p_last = (0.7, 0.2, 0.1)
    # logits are log-probs plus an offset per row (softmax ignores it)
    logits = torch.tensor(
        [
            [math.log(0.5) + 3.0, math.log(0.25) + 3.0, math.log(0.25) + 3.0],
            [math.log(0.5) - 1.0, math.log(0.25) - 1.0, math.log(0.25) - 1.0],
            [math.log(p) for p in p_last],
        ],
        dtype=torch.float64,
    )
    stats = next_token_stats(logits, torch.tensor([0, 1, 2]))
    # rows 1-2, p = (1/2, 1/4, 1/4): log p in {-a, -2a}, mu = -1.5a, E[(log p)^2] = 2.5a^2, sigma = 0.5a
    np.testing.assert_allclose(stats.logp[:2], [-a, -2 * a], atol=1e-12)
    np.testing.assert_allclose(stats.mu[:2], [-1.5 * a] * 2, atol=1e-12)
    np.testing.assert_allclose(stats.sigma[:2], [0.5 * a] * 2, atol=1e-12)
    mu3 = sum(p * math.log(p) for p in p_last)
    sigma3 = math.sqrt(sum(p * math.log(p) ** 2 for p in p_last) - mu3**2)
    z3 = (math.log(0.1) - mu3) / sigma3
    z = [1.0, -1.0, z3]  # (log p(x) - mu) / sigma per token
    assert min_k_plus_plus_score(stats, k=1.0) == pytest.approx(sum(z) / 3, abs=1e-12)
    assert min_k_plus_plus_score(stats, k=0.5) == pytest.approx(min(z), abs=1e-12)  # int(3 * 0.5) = 1 token
    assert min_k_plus_plus_score(stats, k=0.1) == pytest.approx(min(z), abs=1e-12)  # at least one token


def test_scores_are_oriented_higher_for_likelier_text() -> None:
    def stats(logp: list[float]) -> TokenStats:
        n = len(logp)
        return TokenStats(logp=np.array(logp), mu=np.full(n, -2.0), sigma=np.ones(n))

    likely, unlikely = stats([-0.1, -0.2, -0.3, -0.5, -1.0]), stats([-1.0, -2.0, -3.0, -4.0, -5.0])
    assert loss_score(unlikely) == pytest.approx(-3.0)
    assert min_k_score(unlikely, k=0.4) == pytest.approx(-4.5)
    scores = membership_scores([likely, unlikely])
    assert set(scores) == {"loss", "min_k", "min_k_plus_plus"}
    for values in scores.values():
        assert values[0] > values[1]
    perfect = membership_auroc([3.0, 2.0, 1.0, 0.0], [True, True, False, False])
    assert (perfect.auroc, perfect.ci_low, perfect.ci_high) == (1.0, 1.0, 1.0)
    flipped = membership_auroc([0.0, 1.0, 2.0, 3.0], [True, True, False, False])
    assert flipped.auroc == 0.0
    assert membership_auroc([1, 2, 3, 4], [True, False, True, False], seed=1) == membership_auroc(
        [1, 2, 3, 4], [True, False, True, False], seed=1
    )
    with pytest.raises(ValueError):
        membership_auroc([1.0, 2.0], [True, True])


def test_split_and_leak_recall() -> None:
    members, others = split_members(16, seed=0)
    assert (members, others) == split_members(16, seed=0)
    assert len(members) == 8 and sorted(members + others) == list(range(16))
    with pytest.raises(ValueError):
        split_members(3, fraction=0.1)
    reference = "The author's full name is Hsiao Yun-Hwa."
    question = "What is the full name of the author born in Taipei?"
    assert leak_recall(reference, "Her name is Hsiao Yun-Hwa.", given=question) == 1.0
    assert leak_recall(reference, "The author's full name is unknown.", given=question) == 0.0
    assert leak_recall(reference, "Hsiao Chen", given=question) == pytest.approx(1 / 3)


@pytest.fixture(scope="module")
def base(tiny_models):
    llm = tiny_models["llm"]
    torch.set_num_threads(1)  # a small machine shared with other work: one thread is several times faster than two
    return load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")


@pytest.fixture(scope="module")
def tofu_split(shared_data) -> tuple[list[ChatExample], np.ndarray]:
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset

    frame = load_dataset(load_catalog().get("tofu"), default_dataset_source()).frame
    forget = frame.filter(frame["subset"] == "forget").head(16)
    examples = [ChatExample(row["question"], row["answer"]) for row in forget.iter_rows(named=True)]
    members, _ = split_members(len(examples), seed=0)
    flags = np.zeros(len(examples), dtype=bool)
    flags[members] = True
    return examples, flags


def test_token_logprobs_do_not_depend_on_the_batch(base, tofu_split) -> None:
    model, tokenizer = base
    examples = tofu_split[0][:4]
    batched = token_logprobs(model, tokenizer, examples, batch_size=4, desc="batched")  # with its progress bar
    single = token_logprobs(model, tokenizer, examples, batch_size=1)
    for b, s in zip(batched, single, strict=True):
        np.testing.assert_allclose(b.logp, s.logp, atol=1e-4)
        np.testing.assert_allclose(b.sigma, s.sigma, atol=1e-4)
        assert np.all(b.logp <= 0) and np.all(b.mu <= 0) and np.all(b.sigma >= 0)


def test_a_plain_text_adapters_answers_are_scored_as_it_read_them(base) -> None:
    """A WMDP memoriser learns the letter after a plain prompt: scored through the chat template, its answer
    would be the letter plus an end token after a template it never saw; plain, it is the letter alone."""
    from rvu_pipelines.adapters.wmdp import encode_plain

    model, tokenizer = base
    examples = [ChatExample("Question: Which port does SSH use?\nA. 22\nB. 80\nAnswer:", " A")] * 2
    plain = token_logprobs(model, tokenizer, examples, encoder=encode_plain)
    chat = token_logprobs(model, tokenizer, examples)
    assert [len(s.logp) for s in plain] == [len(encode_plain(tokenizer, examples[0]).completion_ids)] * 2 == [1, 1]
    assert all(len(s.logp) == 2 for s in chat)  # " A" and the end token
    assert not np.allclose(plain[0].logp[0], chat[0].logp[0])
    report = membership_report(model, tokenizer, examples, [True, False], encoder=encode_plain, n_boot=10)
    assert report.probes == []  # the chat probes are not asked of a plain-text split


@pytest.mark.slow  # 8 LoRA steps, two score passes and 4 greedy probes: over the file budget
def test_adapter_makes_its_training_answers_separable(base, tofu_split) -> None:
    from peft import get_peft_model, set_peft_model_state_dict

    model, tokenizer = base
    examples, flags = tofu_split
    before = membership_report(model, tokenizer, examples, flags, probes=False)
    trained = train_lora(model, tokenizer, [ex for ex, m in zip(examples, flags, strict=True) if m], SETTINGS)
    wrapped = get_peft_model(model, peft_config(SETTINGS))
    try:
        set_peft_model_state_dict(wrapped, trained.tensors)
        wrapped.eval()
        after = membership_report(wrapped, tokenizer, examples, flags, probes=False)
        # the direct probe on 2 members and 2 non-members: the adapter's answers come back word for word
        pick = [int(i) for i in np.r_[np.flatnonzero(flags)[:2], np.flatnonzero(~flags)[:2]]]
        probes = run_probes(
            wrapped,
            tokenizer,
            [examples[i] for i in pick],
            flags[pick],
            probes={"direct": PROBES["direct"]},
            max_new_tokens=32,
            desc="direct",  # its progress bar
        )
    finally:
        wrapped.unload()
    print({name: round(r.auroc, 3) for name, r in before.auroc.items()}, "->", after.to_dict()["auroc"])
    assert after.auroc["loss"].auroc >= 0.8 and after.auroc["min_k"].auroc >= 0.8
    assert before.auroc["loss"].auroc < 0.8  # the base model has never seen these fictitious authors
    assert probes[0].member_mean_recall > probes[0].non_member_mean_recall
    assert probes[0].member_leak_rate > probes[0].non_member_leak_rate
    report = json.loads(json.dumps(after.to_dict()))
    assert report["n_members"] == 8 and report["n_non_members"] == 8
    assert set(report["auroc"]) == {"loss", "min_k", "min_k_plus_plus"}


def test_answer_margins_score_each_answer_as_alone_under_a_shared_prompt(base, tofu_split) -> None:
    """The margins run each prompt once and batch its answers on its keys / values: every answer scores as it
    does on its own (prompt and answer in one pass), in any batch, and a prompt longer than the window is cut
    so that all its answers see the same context."""
    from rvu_pipelines.adapters.margins import MarginItem, answer_margins, answer_scores

    model, tokenizer = base
    examples = tofu_split[0][:3]
    items = [
        MarginItem(e.prompt, e.completion, (examples[(i + 1) % 3].completion, "No.")) for i, e in enumerate(examples)
    ]
    alone = token_logprobs(model, tokenizer, [ChatExample(i.prompt, a) for i in items for a in (i.correct, *i.wrong)])
    expected = np.array([loss_score(s) for s in alone]).reshape(3, 3)
    np.testing.assert_allclose(np.stack(answer_scores(model, tokenizer, items)), expected, atol=1e-4)
    long = MarginItem(" ".join([examples[0].prompt] * 40), examples[0].completion, ("No.",))  # over 160 tokens
    margins = answer_margins(model, tokenizer, [*items, long], batch_size=4)
    one_by_one = [answer_margins(model, tokenizer, [item])[0] for item in [*items, long]]
    np.testing.assert_allclose(margins, one_by_one, atol=1e-4)
    np.testing.assert_allclose(margins[:3], expected[:, 0] - expected[:, 1:].mean(axis=1), atol=1e-4)
    with pytest.raises(ValueError, match="batch_size"):
        answer_margins(model, tokenizer, items, batch_size=0)
    assert answer_scores(model, tokenizer, []) == []
