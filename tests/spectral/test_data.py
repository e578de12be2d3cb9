"""The evaluation sets built from the real mirror: labels, pairs, spans and a held-out split that never moves."""

from __future__ import annotations

import polars as pl

from rvu_pipelines.spectral.data import EXAMPLE_COLUMNS, PLACEHOLDER, heldout_split


def test_every_set_has_both_labels_spans_and_both_splits(spectral_sets) -> None:
    assert set(spectral_sets) == {"context_verification", "bipia", "injecagent", "deepset"}
    for name, frame in spectral_sets.items():
        assert tuple(frame.columns) == EXAMPLE_COLUMNS, name
        assert set(frame["label"].unique().to_list()) == {0, 1}, name
        assert set(frame["split"].unique().to_list()) == {"calibration", "heldout"}, name
        for row in frame.head(20).iter_rows(named=True):
            assert 0 <= row["doc_start"] < row["doc_end"] <= len(row["text"])


def test_pairs_share_context_and_split(spectral_sets) -> None:
    for name in ("context_verification", "bipia", "injecagent"):
        frame = spectral_sets[name]
        per_group = frame.group_by("group").agg(
            pl.col("label").sort().alias("labels"), pl.col("split").n_unique().alias("splits")
        )
        assert per_group["labels"].to_list() == [[0, 1]] * per_group.height, name
        assert per_group["splits"].max() == 1, name
    tofu = spectral_sets["context_verification"]
    first, second = tofu.row(0, named=True), tofu.row(1, named=True)
    assert first["text"][: first["doc_start"]] == second["text"][: second["doc_start"]]  # same context
    assert "William Shakespeare" in first["text"][first["doc_start"] :]
    assert "William Shakespeare" not in second["text"][second["doc_start"] :]
    assert tofu.height == 2 * 217  # TOFU's 100 real-author and 117 world-fact probes
    injec = spectral_sets["injecagent"]
    assert not injec["text"].str.contains(PLACEHOLDER, literal=True).any()


def test_heldout_split_is_fixed_by_group() -> None:
    assert heldout_split("tofu_world_facts:3") == heldout_split("tofu_world_facts:3")
    shares = [heldout_split(f"g{i}") == "heldout" for i in range(2000)]
    assert 0.36 < sum(shares) / len(shares) < 0.44


def test_deepset_keeps_its_published_test_split(spectral_sets) -> None:
    deepset = spectral_sets["deepset"]
    assert deepset.filter(pl.col("split") == "heldout").height == 116
