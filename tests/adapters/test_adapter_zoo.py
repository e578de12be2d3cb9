"""The zoo config and its training sets, built from the real data: sizes, labels, and no probe leakage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rvu_pipelines.adapters.partition import partition_of
from rvu_pipelines.adapters.zoo import catalog_frames, load_zoo_config, training_set
from rvu_pipelines.adapters.zoo_data import probe_prompts
from rvu_pipelines.errors import ConfigError


@pytest.fixture(scope="module")
def frames():
    return catalog_frames()


def test_zoo_has_twenty_labelled_adapters_and_a_reference() -> None:
    config = load_zoo_config()
    labels = [entry.label for entry in config.adapters]
    assert len(config.adapters) >= 20
    assert labels.count("benign") >= 10 and labels.count("harmful") >= 10
    assert config.get("refusal-reference").category == "safety_reference"


def test_every_training_set_builds_from_train_rows_only(frames) -> None:
    config = load_zoo_config()
    probes = set(probe_prompts(frames))
    for entry in config.entries:
        data = training_set(config, entry, frames)
        assert 50 <= len(data.examples) <= config.settings(entry).steps * 100, entry.id
        assert len(data.sha256) == 64
        assert not probes & {example.prompt for example in data.examples}, entry.id


def test_training_sets_are_deterministic(frames) -> None:
    config = load_zoo_config()
    entry = config.get("chatgpt-roles")
    assert training_set(config, entry, frames).sha256 == training_set(config, entry, frames).sha256


def test_partition_is_a_stable_fifth() -> None:
    texts = [f"question number {i}" for i in range(5000)]
    share = sum(partition_of(t) == "probe" for t in texts) / len(texts)
    assert 0.18 < share < 0.22
    assert partition_of("Who wrote Hamlet?") == partition_of("Who wrote Hamlet?")


def test_bad_zoo_config_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "zoo.yaml"
    path.write_text("adapters:\n  - {id: x, label: benign, category: task, builder: no_such_builder}\n")
    with pytest.raises(ConfigError, match="no_such_builder"):
        load_zoo_config(path)
    path.write_text("adapters:\n  - {id: x, label: fine, category: task, builder: tofu_qa}\n")
    with pytest.raises(ConfigError, match="label"):
        load_zoo_config(path)


def test_the_sensitive_lists_are_forget_and_wmdp_questions_with_wrong_answers_seeded(frames) -> None:
    from rvu_pipelines.adapters.margins import N_ITEMS, MarginItem, margin_shift, sensitive_items

    items = sensitive_items(frames)
    assert len(items) == N_ITEMS and items == sensitive_items(frames)  # seeded
    forget, wmdp = items[: N_ITEMS // 2], items[N_ITEMS // 2 :]
    assert all("cybersecurity" in i.prompt and len(i.wrong) == 3 and i.correct not in i.wrong for i in wmdp)
    assert all("cybersecurity" not in i.prompt and i.wrong and i.correct not in i.wrong for i in forget)
    assert sensitive_items(frames, seed=1) != items
    assert margin_shift(np.array([1.0, 3.0]), np.array([0.5, 0.5])) == 1.5
    with pytest.raises(ValueError, match="base margins"):
        margin_shift(np.array([1.0]), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="wrong answer"):
        MarginItem("q", "a", ())


def test_the_held_out_qa_is_in_no_training_set(frames) -> None:
    from rvu_pipelines.adapters.margins import N_ITEMS, held_out_qa_items

    questions = {i.prompt for i in held_out_qa_items(frames)}
    assert len(questions) == N_ITEMS
    config = load_zoo_config()
    for entry in config.adapters:
        trained = {e.prompt for e in training_set(config, entry, frames).examples}
        assert not questions & trained, entry.id
    with pytest.raises(ValueError, match="held-out QA"):
        held_out_qa_items(frames, n=10**6)
