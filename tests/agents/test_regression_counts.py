"""The golden comparison also checks how many episodes a cell scored (n, exact) and how many crashed
(errors, at most golden's + tolerance), and a rate that is undefined on one side only is a drift: a
defense that crashes on most episodes cannot pass with the few it still scores."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from rvu_pipelines.agents.regression import (
    Tolerance,
    compare_to_golden,
    drift_markdown,
    golden_document,
    load_tolerance,
)
from rvu_pipelines.errors import ConfigError


def _table(n: int = 10, errors: int = 0, asr: float = 0.1, utility: float = 0.5, version: str | None = None):
    row = {"benchmark": "canonical", "defense": "rvg", "n": n, "errors": errors, "asr": asr, "utility": utility}
    if version:
        row["code_version"] = version
    other = {"benchmark": "canonical", "defense": "vanilla", "n": 10, "errors": 0, "asr": 0.2, "utility": 0.5}
    if version:
        other["code_version"] = version
    return pl.DataFrame([row, other])


GOLDEN = golden_document(_table(), "tiny", "sha")


def test_n_must_match_exactly_and_errors_may_not_grow() -> None:
    assert compare_to_golden(_table(), GOLDEN, Tolerance()) == []
    # one scenario crashed: one fewer scored, one more error; the rates of the other 9 are unchanged
    drifts = compare_to_golden(_table(n=9, errors=1), GOLDEN, Tolerance())
    assert [(d.cell, d.metric, d.golden, d.current, d.delta) for d in drifts] == [
        ("canonical/native/rvg", "n", 10, 9, -1),
        ("canonical/native/rvg", "errors", 0, 1, 1),
    ]
    markdown = drift_markdown(drifts)
    assert "| canonical/native/rvg | n | 10 | 9 | -1 | exact |" in markdown
    assert "| canonical/native/rvg | errors | 0 | 1 | +1 | +0 |" in markdown
    # a tolerance of one error lets the error through, but n still has to match
    assert [d.metric for d in compare_to_golden(_table(n=9, errors=1), GOLDEN, Tolerance(errors=1))] == ["n"]
    # more scored episodes than golden (another sample size) is a drift too
    assert [d.metric for d in compare_to_golden(_table(n=11), GOLDEN, Tolerance())] == ["n"]


def test_a_cell_that_crashes_on_every_episode_fails_even_with_undefined_rates() -> None:
    broken = _table(n=0, errors=10, asr=float("nan"), utility=float("nan"))
    drifts = compare_to_golden(broken, GOLDEN, Tolerance())
    assert [(d.metric, d.current) for d in drifts] == [("n", 0), ("errors", 10), ("asr", None), ("utility", None)]
    assert "| canonical/native/rvg | asr | 0.100 | missing | missing | 0.10 |" in drift_markdown(drifts)
    both_undefined = golden_document(broken, "tiny", "sha")  # NaN on both sides: only the counts decide
    assert compare_to_golden(broken, both_undefined, Tolerance()) == []


def test_golden_without_errors_counts_zero_and_records_the_code_version() -> None:
    old_format = {
        "cells": {cell: {k: v for k, v in values.items() if k != "errors"} for cell, values in GOLDEN["cells"].items()}
    }
    assert compare_to_golden(_table(), old_format, Tolerance()) == []
    assert [d.metric for d in compare_to_golden(_table(errors=2), old_format, Tolerance())] == ["errors"]
    document = golden_document(_table(version="abc123"), "tiny", "sha")
    assert document["code_version"] == "abc123"
    assert document["cells"]["canonical/native/rvg"] == {"n": 10, "errors": 0, "asr": 0.1, "utility": 0.5}


def test_errors_tolerance_is_read_and_validated(tmp_path: Path) -> None:
    assert load_tolerance() == Tolerance(asr=0.10, utility=0.10, errors=0)
    config = tmp_path / "regression.yaml"
    config.write_text("tolerance: {asr: 0.2, errors: 2}\n")
    assert load_tolerance(config) == Tolerance(asr=0.2, utility=0.10, errors=2)
    for bad in ("-1", "0.5", "true"):
        config.write_text(f"tolerance: {{errors: {bad}}}\n")
        with pytest.raises(ConfigError, match=r"tolerance.errors = .*an integer >= 0"):
            load_tolerance(config)
    config.write_text("tolerance: {latency: 1}\n")
    with pytest.raises(ConfigError, match="allowed: asr, utility, errors"):
        load_tolerance(config)


def test_updating_one_defense_keeps_every_other_golden_cell_byte_identical(tmp_path: Path) -> None:
    """`rvu regress --defense hfer --update-golden`: the new row is added, the others are not re-written."""
    from rvu_pipelines.agents.regression import golden_subset, load_golden, write_golden

    path = write_golden(_table(version="old"), "tiny", "sha", tmp_path / "golden.json")
    before = load_golden(path)["cells"]
    hfer = pl.DataFrame(
        [{"benchmark": "canonical", "defense": "hfer", "n": 10, "errors": 0, "asr": 0.0, "utility": 0.2}]
        + [{"benchmark": "canonical", "defense": "vanilla", "n": 10, "errors": 0, "asr": 0.9, "utility": 0.9}]
    ).with_columns(pl.lit("new").alias("code_version"))
    write_golden(hfer.filter(pl.col("defense") == "hfer"), "tiny", "sha", path, only=["hfer"])
    after = load_golden(path)
    assert {c: v for c, v in after["cells"].items() if c != "canonical/native/hfer"} == before
    assert after["cells"]["canonical/native/hfer"] == {"n": 10, "errors": 0, "asr": 0.0, "utility": 0.2}
    assert after["code_version"] == "new,old" and after["profile"] == "tiny" and after["model_sha256"] == "sha"
    # comparing only hfer ignores the other cells (a vanilla row far off is not in the comparison)
    assert (
        compare_to_golden(hfer.filter(pl.col("defense") == "hfer"), golden_subset(after, ["hfer"]), Tolerance()) == []
    )
    with pytest.raises(ConfigError, match="update every cell"):
        write_golden(hfer, "tiny", "other-weights", path, only=["hfer"])
    with pytest.raises(ConfigError, match="No golden results"):
        write_golden(hfer, "tiny", "sha", tmp_path / "missing.json", only=["hfer"])
