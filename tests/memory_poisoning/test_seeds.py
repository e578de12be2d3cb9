"""The study's statistics across draws: the paired comparisons (clustered on records, Bonferroni over the table)
and the sweep over splits and seeds (real MiniLM, real StrategyQA / MINJA, tiny trigger search)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.attacks.agentpoison import TriggerConfig
from rvu_pipelines.memory_poisoning.comparisons import comparisons_markdown, paired_comparisons
from rvu_pipelines.memory_poisoning.seeds import SweepConfig, seed_sweep, write_sweep
from rvu_pipelines.memory_poisoning.study import attack_defense_matrix, detector_suite
from rvu_pipelines.memory_poisoning.study_cells import EmbeddingCache, StudyConfig, build_cell
from rvu_pipelines.results_pages import write_result_pages
from rvu_pipelines.tracking import git_commit

CONFIG = StudyConfig(
    regime="small",
    n_queries=40,
    agentpoison_poisons=5,
    agentpoison_train=10,
    trigger=TriggerConfig.tiny(),
    minja_victims=("camera", "chair"),
    minja_attack_queries=4,
)
SUITE = ("memsad", "energy", "knn")


@pytest.fixture(scope="module")
def frames(strategyqa_frame, minja_frame):
    return {"agentpoison_strategyqa": strategyqa_frame, "minja": minja_frame}


@pytest.fixture(scope="module")
def embed(study_embeddings) -> EmbeddingCache:
    return study_embeddings  # shared by the matrix and the sweep, as one study shares it


@pytest.fixture(scope="module")
def matrix(frames, embed):
    cells = [build_cell(name, frames, embed, CONFIG) for name in ("agentpoison", "minja")]
    suite = {k: v for k, v in detector_suite(2.0).items() if k in SUITE}
    return attack_defense_matrix(cells, suite)


def test_minja_negatives_are_counted_as_the_records_they_are(matrix) -> None:
    table, raw = matrix
    minja = table.filter(pl.col("attack") == "minja").row(0, named=True)
    scores = raw[("minja", minja["defense"], "plain")]
    # the two victim settings share the StrategyQA half of their benign writes: fewer records than rows
    assert minja["n_benign_records"] == len(set(scores.benign_keys)) < minja["n_benign"] == len(scores.benign_keys)
    clusters = scores.clusters()
    assert clusters is not None and clusters.size == minja["n_poisons"] + minja["n_benign"]
    ap = table.filter(pl.col("attack") == "agentpoison").row(0, named=True)
    assert ap["n_benign_records"] == ap["n_benign"]  # one setting: every benign write is its own record


def test_paired_comparisons_correct_over_the_whole_table(matrix) -> None:
    _, raw = matrix
    table = paired_comparisons(raw, n_resamples=500)
    # AgentPoison at plain and triggered, MINJA at plain; MEMSAD against energy and knn in each
    assert table.height == 3 * 2 and set(table["m"].to_list()) == {6}
    assert set(zip(table["attack"], table["calibration"], strict=True)) == {
        ("agentpoison", "plain"),
        ("agentpoison", "triggered"),
        ("minja", "plain"),
    }
    for r in table.iter_rows(named=True):
        assert r["a"] == "memsad" and r["alpha_corrected"] == pytest.approx(0.05 / 6)
        assert r["significant"] == (r["p_value"] < 0.05 / 6)
        assert r["difference"] == pytest.approx(r["auroc_a"] - r["auroc_b"])
        assert r["ci_low"] <= r["difference"] <= r["ci_high"]
    markdown = comparisons_markdown(table)
    assert "m = 6 comparisons" in markdown and markdown.count("\n| ") == table.height
    # a paired test refuses two detectors that scored different examples
    key = ("minja", "knn", "plain")
    broken = {**raw, key: replace(raw[key], benign_keys=raw[key].benign_keys[::-1])}
    with pytest.raises(MemoryPoisoningInputError, match="different examples"):
        paired_comparisons(broken, n_resamples=200)


def test_the_sweep_draws_each_seed_afresh_and_reports_its_spread(frames, embedder, embed, tmp_path: Path) -> None:
    config = SweepConfig(seeds=(0, 1), regimes=("small",), base=CONFIG)
    with pytest.raises(MemoryPoisoningInputError, match="another embedder"):
        seed_sweep(frames, object(), config, embed=embed)  # type: ignore[arg-type]
    result = seed_sweep(frames, embedder, config, attacks=("agentpoison",), embed=embed)
    per_seed = result.per_seed
    assert sorted(set(per_seed["seed"].to_list())) == [0, 1]
    one = per_seed.filter((pl.col("attack") == "agentpoison") & (pl.col("defense") == "memsad"))
    plain = one.filter(pl.col("calibration") == "plain").sort("seed")
    # a new seed is a new split and a new trigger: the draws differ
    assert plain["auroc"][0] != plain["auroc"][1] or plain["threshold"][0] != plain["threshold"][1]
    summary = result.summary.filter(
        (pl.col("attack") == "agentpoison") & (pl.col("defense") == "memsad") & (pl.col("calibration") == "plain")
    ).row(0, named=True)
    assert summary["n_seeds"] == 2
    assert summary["auroc_mean"] == pytest.approx(float(np.mean(plain["auroc"].to_list())))
    assert summary["auroc_sd"] == pytest.approx(float(np.std(plain["auroc"].to_list(), ddof=1)))
    compared = result.comparison_summary
    assert set(compared["n_seeds"].to_list()) == {2}
    assert all(0 <= s <= 2 for s in compared["seeds_significant"].to_list())
    state = tmp_path / "state"
    files = write_sweep(result, state / "memory_poisoning" / "seeds")
    text = files["seeds_md"].read_text()
    assert "small / agentpoison" in text and "±" in text and "2 seeds" in text
    assert files["seeds_png"].stat().st_size > 0
    assert pl.read_parquet(files["per_seed_parquet"]).height == per_seed.height
    # the docs' result page is this run's table under this run's stamp (``rvu report``)
    outcomes = {o.source.name: o for o in write_result_pages(state, tmp_path / "results")}
    assert outcomes["memory-poisoning-seeds"].status == "written"
    assert outcomes["spectral-controls"].status == "missing"
    page = (tmp_path / "results" / "memory-poisoning-seeds.md").read_text()
    assert text.strip() in page and f"at commit {git_commit()[:12]}" in page
    assert page.count("Measured ") == 1 and "Unstamped" not in page
    index = (tmp_path / "results" / "index.md").read_text()
    assert "| regenerated |" in index and "`make spectral`" in index


def test_a_sweep_needs_two_seeds() -> None:
    with pytest.raises(MemoryPoisoningInputError, match="two distinct seeds"):
        SweepConfig(seeds=(3, 3))
