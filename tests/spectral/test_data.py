"""The evaluation sets built from the real mirror: labels, pairs, spans and a held-out split that never moves."""

from __future__ import annotations

import polars as pl
import pytest

from rvu_pipelines.spectral import SpectralInputError
from rvu_pipelines.spectral.data import (
    EXAMPLE_COLUMNS,
    PLACEHOLDER,
    ROLE_COLUMN,
    heldout_split,
    keep_whole_groups,
    length_matched_clean,
)


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


def test_length_matched_clean_on_bipia(spectral_sets) -> None:
    bipia = spectral_sets["bipia"]
    triples = length_matched_clean(bipia, tolerance=12, seed=0)
    assert tuple(triples.columns) == (*EXAMPLE_COLUMNS, ROLE_COLUMN)
    assert triples.height == 3 * bipia["group"].n_unique()
    assert (
        triples.filter(pl.col(ROLE_COLUMN) != "padded")
        .drop(ROLE_COLUMN)
        .sort(["group", "label"])
        .equals(bipia.sort(["group", "label"]))
    )  # the pairs are untouched
    n = pl.col("text").str.len_chars().cast(pl.Int64)
    wide = triples.with_columns(n.alias("n")).pivot(on=ROLE_COLUMN, index="group", values="n")
    assert ((wide["padded"] - wide["injected"]).abs() <= 12).all()
    padded = triples.filter(pl.col(ROLE_COLUMN) == "padded")
    assert set(padded["label"].to_list()) == {0}
    clean_docs = "\n".join(
        r["text"][r["doc_start"] : r["doc_end"]] for r in bipia.filter(pl.col("label") == 0).iter_rows(named=True)
    )
    by_group = {r["group"]: r for r in bipia.filter(pl.col("label") == 0).iter_rows(named=True)}
    for row in padded.head(60).iter_rows(named=True):
        own = by_group[row["group"]]
        doc = own["text"][own["doc_start"] : own["doc_end"]]
        new = row["text"][row["doc_start"] : row["doc_end"]]
        at = next((i for i in range(len(doc)) if doc[i] != new[i]), len(doc))
        added = new[at : len(new) - (len(doc) - at)]
        assert new[:at] + new[len(new) - (len(doc) - at) :] == doc  # the clean text plus one inserted block
        for line in added.strip("\n").split("\n")[:-1]:  # whole padding lines (the last may be cut)
            assert line in clean_docs
    assert length_matched_clean(bipia, seed=0).equals(triples)
    assert not length_matched_clean(bipia, seed=1).equals(triples)
    with pytest.raises(SpectralInputError, match="deepset"):
        length_matched_clean(spectral_sets["deepset"].head(4))


def test_keep_whole_groups_drops_a_group_with_any_long_member(spectral_sets) -> None:
    triples = length_matched_clean(spectral_sets["bipia"])
    kept = keep_whole_groups(triples, len, 400)
    assert (kept["text"].str.len_chars() <= 400).all()
    assert (kept.group_by("group").len()["len"] == 3).all() and 0 < kept.height < triples.height
