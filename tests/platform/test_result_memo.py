"""Reusing an unchanged step's result: any change in what it depends on is a miss."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from rvu_pipelines.result_memo import ResultMemo, frame_digest

CODE = "rvu_pipelines.result_memo"  # the step module a key is for (its code closure is part of the key)


def test_a_result_is_reused_only_while_nothing_it_depends_on_changed(tmp_path: Path, monkeypatch) -> None:
    memo = ResultMemo(tmp_path / "memo")
    artefact = tmp_path / "table.md"
    artefact.write_text("| a |\n")
    parts = {"params": {"k": 3}, "frames": {"x": frame_digest(pl.DataFrame({"a": [1, 2]}))}}
    key = memo.key(parts, code=CODE)
    assert memo.load("study", key) is None
    memo.save("study", key, {"auroc": 0.91, "file": str(artefact)}, files=[artefact])
    assert memo.load("study", key) == {"auroc": 0.91, "file": str(artefact)}
    # another parameter, another input row, another RVU_* setting: other keys
    assert memo.key({**parts, "params": {"k": 4}}, code=CODE) != key
    assert memo.key({**parts, "frames": {"x": frame_digest(pl.DataFrame({"a": [1, 3]}))}}, code=CODE) != key
    monkeypatch.setenv("RVU_SOMETHING_NEW", "1")
    assert memo.key(parts, code=CODE) != key
    monkeypatch.delenv("RVU_SOMETHING_NEW")
    assert memo.key(parts, code=CODE) == key
    # the switch turns reuse off
    monkeypatch.setenv("RVU_REUSE_RESULTS", "0")
    assert memo.load("study", key) is None
    monkeypatch.delenv("RVU_REUSE_RESULTS")
    # a file the result points to changed: computed again
    artefact.write_text("| b |\n")
    assert memo.load("study", key) is None
    artefact.write_text("| a |\n")
    assert memo.load("study", key) is not None
    # a damaged entry is a miss, never an error
    (tmp_path / "memo" / "study" / f"{key}.json").write_text("{not json")
    assert memo.load("study", key) is None


@pytest.mark.parametrize(
    "other", [pl.DataFrame({"a": [2, 1]}), pl.DataFrame({"b": [1, 2]}), pl.DataFrame({"a": [1.0, 2.0]})]
)
def test_frame_digest_sees_order_names_and_types(other: pl.DataFrame) -> None:
    base = pl.DataFrame({"a": [1, 2]})
    assert frame_digest(base) == frame_digest(pl.DataFrame({"a": [1, 2]}))
    assert frame_digest(other) != frame_digest(base)
