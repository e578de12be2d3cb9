"""Every loader on the real mirror gives exactly the published counts."""

from __future__ import annotations

import pytest

from rvu_pipelines.data import MirrorDatasetSource, check_counts, load_catalog, load_dataset
from rvu_pipelines.data.agentdojo_suites import check_suite_counts, load_agentdojo_suites
from rvu_pipelines.data.catalog import observed_group_counts

PUBLISHED = {
    "deepset_prompt_injections": (662, {("split",): {"train": 546, "test": 116}}),
    "awesome_chatgpt_prompts": (1200, {}),
    "trustair_jailbreaks": (1405, {}),
    "wmdp_cyber": (1987, {}),
    "injecagent": (1054, {("setting",): {"dh": 510, "ds": 544}}),
    "bipia": (
        1450,
        {
            ("record_type", "task", "split"): {
                "task/email/train": 50,
                "task/email/test": 50,
                "task/table/train": 900,
                "task/table/test": 100,
                "task/code/train": 50,
                "task/code/test": 50,
                "attack/text/train": 75,
                "attack/text/test": 75,
                "attack/code/train": 50,
                "attack/code/test": 50,
            }
        },
    ),
    "tofu": (517, {("subset",): {"forget": 300, "real_authors": 100, "world_facts": 117}}),
    "agentpoison_strategyqa": (3311, {("split",): {"train": 2821, "test": 490}}),
    "minja": (999, {}),
}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_catalog_covers_the_nine_mirrored_data_sets(catalog) -> None:
    assert sorted(catalog.datasets) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_loader_gives_published_counts(name: str, catalog, shared_data) -> None:
    loaded = load_dataset(catalog.get(name), MirrorDatasetSource(shared_data))
    rows, groups = PUBLISHED[name]
    assert loaded.frame.height == rows
    for by, counts in groups.items():
        assert observed_group_counts(loaded.frame, list(by)) == counts
    assert check_counts(loaded.spec, loaded.frame) == []
    assert all(loaded.resolved.verified.values())


def test_deepset_keeps_upstream_split_order(catalog, shared_data) -> None:
    frame = load_dataset(catalog.get("deepset_prompt_injections"), MirrorDatasetSource(shared_data)).frame
    assert frame["split"][:546].unique().to_list() == ["train"]
    assert frame["split"][546:].unique().to_list() == ["test"]
    assert int(frame["label"].sum()) == 263


def test_minja_has_nine_victims_and_wmdp_four_choices(catalog, shared_data) -> None:
    source = MirrorDatasetSource(shared_data)
    minja = load_dataset(catalog.get("minja"), source).frame
    assert minja["victim"].n_unique() == 9
    wmdp = load_dataset(catalog.get("wmdp_cyber"), source).frame
    assert set(wmdp["choices"].list.len().unique().to_list()) == {4}
    assert wmdp["answer"].is_between(0, 3).all()


def test_count_check_reports_a_missing_row(catalog, shared_data) -> None:
    spec = catalog.get("injecagent")
    frame = load_dataset(spec, MirrorDatasetSource(shared_data)).frame
    problems = check_counts(spec, frame.slice(1))
    assert [str(p) for p in problems] == [
        "rows: expected 1054, got 1053",
        "rows with setting=dh: expected 510, got 509",
    ]


def test_agentdojo_suites_from_package(catalog) -> None:
    frame = load_agentdojo_suites(catalog.agentdojo)
    assert check_suite_counts(catalog.agentdojo, frame) == []
    assert int(frame["user_tasks"].sum()) == 97
    assert int(frame["injection_tasks"].sum()) == 35
