"""The inline hfer defense's cost on real AgentDojo tool outputs, scored by a real (small) switch."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rvu_pipelines.spectral.data import DOCUMENT_TEMPLATE


@pytest.fixture(scope="module")
def banking_outputs() -> pl.DataFrame:
    from rvu_pipelines.spectral.tool_outputs import agentdojo_tool_outputs

    return agentdojo_tool_outputs(suite_names=["banking"])


def test_tool_outputs_pair_the_same_call_clean_and_injected(banking_outputs: pl.DataFrame) -> None:
    frame = banking_outputs
    assert set(frame["split"]) == {"heldout", "calibration"} and set(frame["source"]) == {"agentdojo_banking"}
    task_of = frame["group"].str.extract(r"^(agentdojo/[^/]+/[^/]+)/")
    assert frame.group_by(task_of).agg(pl.col("split").n_unique())["split"].max() == 1  # one side per user task
    clean, injected = frame.filter(pl.col("label") == 0), frame.filter(pl.col("label") == 1)
    assert injected.height > 0 and clean.height > injected.height  # some outputs no placeholder reaches
    assert set(injected["group"]) <= set(clean["group"])  # every injected output has its clean partner
    for row in injected.iter_rows(named=True):
        partner = clean.filter(pl.col("group") == row["group"]).row(0, named=True)
        assert row["text"] != partner["text"]
        assert row["text"][: row["doc_start"]] == partner["text"][: partner["doc_start"]]  # same request
    assert not any("<INFORMATION>" in text for text in clean["text"])  # the attack's own framing
    assert all("<INFORMATION>" in text for text in injected["text"])
    for row in frame.head(5).iter_rows(named=True):  # the form the inline switch reads: request, blank line, output
        request = row["text"][: row["doc_start"]]
        assert request == DOCUMENT_TEMPLATE.format(instruction=request[:-2]) and request.endswith("\n\n")
        assert row["text"][row["doc_start"] : row["doc_end"]].strip()


def test_unknown_suite_is_refused_naming_the_allowed_ones() -> None:
    from rvu_pipelines.spectral.tool_outputs import agentdojo_tool_outputs

    with pytest.raises(ValueError, match="banking"):
        agentdojo_tool_outputs(suite_names=["bank"])


def test_inline_cost_reports_rates_the_switch_really_has(hfer_detector, banking_outputs: pl.DataFrame) -> None:
    from rvu_pipelines.spectral.inline_cost import inline_cost

    groups = banking_outputs.filter(pl.col("label") == 1)["group"].to_list()[:3]
    lonely = [g for g in banking_outputs["group"].unique(maintain_order=True) if g not in set(groups)][:2]
    sample = banking_outputs.filter(pl.col("group").is_in(groups + lonely))
    sample = sample.filter(pl.col("text").str.len_chars() < 2500)
    cost = inline_cost(hfer_detector, sample)
    scores = cost.scores
    assert scores.height + cost.skipped_too_long == sample.height
    assert scores.height == sample.height  # every sampled output fits the model's context
    again = hfer_detector.score(sample["text"].to_list()[:1])
    assert again[0] == pytest.approx(scores["score"][0])  # deterministic: the same text scores the same
    labels = scores["label"].to_numpy().astype(bool)
    fired = scores["score"].to_numpy() >= cost.threshold
    pooled = next(row for row in cost.sources if row.source == "all")
    assert pooled.n_clean == int((~labels).sum()) and pooled.n_injected == int(labels.sum())
    assert pooled.fpr["value"] == pytest.approx(float(fired[~labels].mean()))
    assert pooled.tpr is not None and pooled.tpr["value"] == pytest.approx(float(fired[labels].mean()))
    assert cost.latency_ms["n"] == scores.height and cost.latency_ms["median"] > 0
    assert np.all((scores["score"].to_numpy() >= 0) & (scores["score"].to_numpy() <= 1))
    assert "| agentdojo_banking |" in cost.markdown()
