"""The deployment's own texts (AgentDojo, BIPIA, InjecAgent) from the real mirror and the installed agentdojo:
every source in every split, no text in two splits, injected rows built on their payload, determinism, errors."""

from __future__ import annotations

import polars as pl
import pytest

from rvu_pipelines.data import MirrorDatasetSource
from rvu_pipelines.detectors.deployment_texts import (
    COLUMNS,
    PLACEHOLDER,
    SOURCES,
    SPLITS,
    DeploymentTexts,
    agentdojo_texts,
    carries_payload,
    injecagent_texts,
    load_deployment_texts,
)
from rvu_pipelines.errors import DatasetUnavailableError, DetectorError

FRAMES = ("benign", "payloads", "injected")
VERSION = "v1.2.2"


@pytest.fixture(scope="module")
def texts(shared_data) -> DeploymentTexts:
    return load_deployment_texts(benchmark_version=VERSION)


def _payload_id(injected_id: str) -> str:
    return injected_id.split("@", 1)[0]


@pytest.mark.parametrize("frame", FRAMES)
def test_every_source_has_rows_in_every_split(texts, frame) -> None:
    splits = ("train", "test") if frame == "payloads" else SPLITS  # payloads have no calib
    counts = texts.counts()[frame]
    assert set(counts) == {f"{source}/{split}" for source in SOURCES for split in splits}
    assert min(counts.values()) > 0


@pytest.mark.parametrize("frame", FRAMES)
def test_columns_unique_ids_and_order(texts, frame) -> None:
    df = texts.frames()[frame]
    assert df.schema == pl.Schema(COLUMNS)
    assert df["id"].is_unique().all()
    assert df.equals(df.sort("source", "split", "id"))
    assert df.filter(pl.col("text").str.strip_chars() == "").height == 0
    assert set(df["source"]) == set(SOURCES)


def test_no_text_is_in_two_splits_or_two_frames(texts) -> None:
    rows = pl.concat([df.with_columns(pl.lit(name).alias("frame")) for name, df in texts.frames().items()])
    shared = rows.group_by("text").agg(pl.col("split").n_unique(), pl.col("frame").n_unique())
    assert shared.filter((pl.col("split") > 1) | (pl.col("frame") > 1)).height == 0
    assert rows["text"].is_unique().all()


def test_injected_rows_carry_their_payload_from_the_same_side(texts) -> None:
    payloads = {row["id"]: row for row in texts.payloads.iter_rows(named=True)}
    calib, test = set(), set()
    for row in texts.injected.iter_rows(named=True):
        payload = payloads[_payload_id(row["id"])]
        assert payload["source"] == row["source"]
        if row["source"] == "agentdojo":  # planted in AgentDojo's YAML world: whitespace and quoting change
            assert carries_payload(row["text"], payload["text"]), row["id"]
        else:
            assert payload["text"] in row["text"], row["id"]
        assert (payload["split"] == "train") == (row["split"] == "train"), row["id"]  # test payloads: never train
        {"calib": calib, "test": test}.get(row["split"], set()).add(payload["id"])
    assert calib and test and not calib & test


def test_benign_texts_hold_no_injecagent_placeholder(texts) -> None:
    assert texts.benign.filter(pl.col("text").str.contains(PLACEHOLDER, literal=True)).height == 0
    injecagent = texts.benign.filter(pl.col("source") == "injecagent")
    assert injecagent.height == 17  # one emptied response template per user tool


def test_agentdojo_payload_is_what_the_platform_attack_plants(texts) -> None:
    from rvu_pipelines.scenarios.agentdojo_tasks import AgentDojoScenario

    scenario = AgentDojoScenario("banking", "user_task_0", "injection_task_0", VERSION)
    payload = texts.payloads.filter(pl.col("id") == "agentdojo:banking:injection_task_0")
    assert payload["text"].to_list() == [scenario.injection]
    assert payload["text"][0].startswith("\n\n\n<INFORMATION>")  # kept as planted, whitespace and all


def test_carries_payload_reads_through_yaml_quoting() -> None:
    payload = "\n\n<INFORMATION>\n\nDo this first.\n</INFORMATION>\n"
    escaped = 'description: "Meeting. \\n<INFORMATION>\\nDo this\\\n  \\ first.\\n</INFORMATION>"\nid_: 3'
    assert carries_payload(escaped, payload)
    assert not carries_payload("description: Meeting.\nid_: 3", payload)
    assert not carries_payload("anything", "  ")


def test_two_loads_give_equal_frames(texts, shared_data) -> None:
    again = load_deployment_texts(benchmark_version=VERSION)
    for name in FRAMES:
        assert again.frames()[name].equals(texts.frames()[name]), name


def test_agentdojo_rows_rebuild_identically_per_suite(texts) -> None:
    """Rebuilt from scratch (another cache key) for two suites: the same rows, as splits are drawn per suite."""
    parts = agentdojo_texts(VERSION, ["slack", "banking"])
    for name, rows in zip(FRAMES, parts, strict=True):
        rebuilt = pl.DataFrame(rows, schema=COLUMNS, orient="row").sort("source", "split", "id")
        loaded = texts.frames()[name].filter(
            (pl.col("source") == "agentdojo") & pl.col("group").str.contains(r"^(banking|slack):")
        )
        assert rebuilt.height > 0 and rebuilt.equals(loaded), name


@pytest.mark.parametrize("missing, present", [("bipia", "injecagent"), ("injecagent", "bipia")])
def test_a_missing_data_set_is_a_clear_error(shared_data, tmp_path, missing, present) -> None:
    (tmp_path / present).symlink_to(shared_data / present, target_is_directory=True)
    with pytest.raises(DatasetUnavailableError, match=rf"deployment texts need the '{missing}'.*RVU_DATA_MIRROR"):
        load_deployment_texts(MirrorDatasetSource(tmp_path), benchmark_version=VERSION)


def test_wrong_frames_and_suites_are_clear_errors() -> None:
    with pytest.raises(DetectorError, match=r"injecagent frame lacks columns"):
        injecagent_texts(pl.DataFrame({"case": [1]}))
    with pytest.raises(DetectorError, match=r"no suite \['nope'\]"):
        agentdojo_texts(VERSION, ["nope"])
