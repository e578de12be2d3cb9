"""The kill switch's baselines on the real model (Attention Tracker's probe, span perplexity) and the comparison
table (alignment check, LODO rows, markdown) on real features of a few examples."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from rvu_pipelines.spectral import SpectralInputError
from rvu_pipelines.spectral.baselines import (
    PROBE_INSTRUCTION,
    AttentionTracker,
    BaselineFeatures,
    extract_baselines,
    probe_prompt,
    span_nll,
    synthetic_pairs,
)
from rvu_pipelines.spectral.comparison import (
    ATTENTION_TRACKER,
    ATTENTION_TRACKER_RAW,
    SAME_ALL,
    SetFeatures,
    comparison_table,
    markdown_table,
)
from rvu_pipelines.spectral.study import extract_features, limit_groups


def test_probe_prompt_marks_exactly_the_instruction(spectral_model) -> None:
    text, instruction = probe_prompt(spectral_model, "Please book a table for two.")
    ids = spectral_model.tokenize(text)["input_ids"][0].tolist()
    assert spectral_model.tokenizer.decode(ids[instruction]).strip() == PROBE_INSTRUCTION
    assert "Data: Please book" in text  # the reference code's user message
    assert text.rstrip().endswith("assistant")  # the generation prompt: the last token is where it answers


def test_span_nll_equals_the_full_pass_log_likelihood(spectral_model) -> None:
    import torch

    text = "Context: Paris is the capital of France.\nStatement: The capital of France is Paris."
    start = text.index("The capital")
    encoded = spectral_model.tokenize(text)
    offsets = encoded.pop("offset_mapping")[0].tolist()
    first = next(i for i, (a, b) in enumerate(offsets) if b > start)
    with torch.inference_mode():
        logits = spectral_model.model(**encoded, use_cache=False).logits[0]
    ids = encoded["input_ids"][0]
    expected = -torch.log_softmax(logits[first - 1 : -1], -1).gather(1, ids[first:, None]).mean()
    assert span_nll(spectral_model, text, start, len(text)) == pytest.approx(float(expected), abs=1e-4)
    # a contradicted statement is more surprising than the supported one after the same context
    wrong = text.replace("is Paris.", "is Madrid.")
    assert span_nll(spectral_model, wrong, start, len(wrong)) > span_nll(spectral_model, text, start, len(text))
    with pytest.raises(SpectralInputError):
        span_nll(spectral_model, text, 0, 1)  # the first token has no prefix to be scored against


def test_synthetic_pairs_are_real_answers_plus_an_injection(spectral_sets, shared_data) -> None:
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset

    tofu = load_dataset(load_catalog().get("tofu"), default_dataset_source()).frame
    pairs = synthetic_pairs(tofu, n=6)
    assert len(pairs) == 6 and all(attacked.startswith(clean + "\n") for clean, attacked in pairs)
    assert len({attacked.split("\n")[-1] for _, attacked in pairs}) == 6  # templates rotate
    with pytest.raises(SpectralInputError):
        synthetic_pairs(tofu.head(0))


@pytest.fixture(scope="module")
def small_sets(spectral_model, spectral_sets) -> dict[str, SetFeatures]:
    """Real spectral + baseline features of 10 short examples per source: 3 calibration and 2 held-out pairs."""
    out = {}
    for name in ("context_verification", "injecagent"):
        short = spectral_sets[name].filter(pl.col("text").str.len_chars().max().over("group") < 420)
        frame = pl.concat(
            [limit_groups(short.filter(pl.col("split") == split), size, seed=3)
             for split, size in (("calibration", 6), ("heldout", 4))]
        )  # fmt: skip
        spectral = extract_features(spectral_model, frame, name=name, max_tokens=160)["text"]
        baselines = extract_baselines(spectral_model, frame, name=name, max_tokens=160)
        out[name] = SetFeatures(spectral, baselines)
    return out


def test_baselines_line_up_with_the_spectral_features(small_sets) -> None:
    for features in small_sets.values():
        b = features.baselines
        assert b.instruction_attention.shape[0] == b.span_nll.size == b.spans.size == features.spectral.labels.size
        assert np.isfinite(b.span_nll).all() and (b.instruction_attention >= 0).all()
        assert b.data_attention is not None and b.data_attention.shape == b.instruction_attention.shape
        assert (b.instruction_attention + b.data_attention <= 1 + 1e-5).all()
    bad = small_sets["injecagent"].baselines
    shifted = BaselineFeatures(bad.name, bad.instruction_attention, bad.span_nll, bad.spans, bad.labels[::-1],
                               bad.splits, bad.sources)  # fmt: skip
    with pytest.raises(SpectralInputError, match="different examples"):
        SetFeatures(small_sets["injecagent"].spectral, shifted)


def test_baseline_features_round_trip(small_sets, tmp_path) -> None:
    features = small_sets["context_verification"].baselines
    features.save(str(tmp_path / "b.npz"))
    loaded = BaselineFeatures.load(str(tmp_path / "b.npz"))
    np.testing.assert_array_equal(loaded.instruction_attention, features.instruction_attention)
    np.testing.assert_array_equal(loaded.data_attention, features.data_attention)
    assert loaded.spans.tolist() == features.spans.tolist()
    # a record written without data attention still loads; only the raw score can use it
    old = dataclasses.replace(features, data_attention=None)
    old.save(str(tmp_path / "old.npz"))
    assert "data_attention" not in np.load(str(tmp_path / "old.npz")).files
    loaded = BaselineFeatures.load(str(tmp_path / "old.npz"))
    assert loaded.data_attention is None
    heads = np.ones(features.instruction_attention.shape[1:], dtype=bool)
    assert np.isfinite(AttentionTracker(heads, 1.0, 0, mode="raw").score_features(loaded)).all()
    with pytest.raises(SpectralInputError, match="data attention"):
        AttentionTracker(heads, 1.0, 0).score_features(loaded)


def test_comparison_table_rows_and_markdown(small_sets) -> None:
    heads = np.zeros(small_sets["injecagent"].baselines.instruction_attention.shape[1:], dtype=bool)
    heads[0, 0] = True
    trackers = [AttentionTracker(heads, k=1.0, n_pairs=0), AttentionTracker(heads, k=1.0, n_pairs=0, mode="raw")]
    from rvu_pipelines.detectors.heuristic import HeuristicDetector

    table = comparison_table(small_sets, trackers, {"D1 regex heuristic": HeuristicDetector()}, draws=2)
    assert table.filter(pl.col("method").is_in([ATTENTION_TRACKER, ATTENTION_TRACKER_RAW])).height == 4
    assert set(table["set"]) == {"context_verification", "injecagent"}
    # context verification and contamination are different tasks: no cross-task switch rows
    cross = table.filter(pl.col("method").str.starts_with("HFER switch calibrated on"))
    assert cross.height == 0
    same = table.filter(pl.col("method") == SAME_ALL)
    assert (
        same.height == 2
        and (same["n"] == [int((f.spectral.splits == "heldout").sum()) for f in small_sets.values()]).all()
    )
    text = markdown_table(table, ["context_verification", "injecagent"])
    assert text.splitlines()[0] == "| method | context_verification | injecagent |"
    assert "D1 regex heuristic" in text and text.splitlines()[-1].startswith("| held-out n |")
