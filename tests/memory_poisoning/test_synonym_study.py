"""`make memsad-synonym` is a Dagster job over the library's synonym study; bad settings are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.synonym_study import SynonymStudyOptions, run_synonym_study


def test_make_memsad_synonym_launches_its_job_with_a_checked_config() -> None:
    from dagster import DagsterInvalidConfigError, validate_run_config

    from assets.definitions import defs

    root = Path(__file__).resolve().parents[2]
    assert "--job memsad_synonym_job" in (root / "Makefile").read_text()
    job = defs.resolve_job_def("memsad_synonym_job")
    keys = {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
    assert {"memory_poisoning_synonym", "agentpoison_strategyqa", "embedder_model"} <= keys
    assert validate_run_config(job, {"ops": {"memory_poisoning_synonym": {"config": {"poisons": 20}}}})
    with pytest.raises(DagsterInvalidConfigError, match="poisons"):
        validate_run_config(job, {"ops": {"memory_poisoning_synonym": {"config": {"poisons": "all"}}}})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"regime": "huge"}, "regime 'huge' is not one of"),
        ({"methods": ("hotflip",)}, "methods \\['hotflip'\\]"),
        ({"methods": ()}, "methods \\[\\]"),
        ({"poisons": 1}, "poisons 1"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(settings: dict, message: str) -> None:
    with pytest.raises(MemoryPoisoningInputError, match=message):
        SynonymStudyOptions(**settings)


@pytest.mark.slow  # a short trigger search and WordNet substitution on a few poisons
def test_the_study_writes_its_stamped_table(embedder, shared_data, tmp_path: Path) -> None:
    from rvu_pipelines.data.catalog import load_catalog, load_dataset
    from rvu_pipelines.data.sources import default_dataset_source

    frame = load_dataset(load_catalog().datasets["agentpoison_strategyqa"], default_dataset_source()).frame
    options = SynonymStudyOptions(poisons=3, regime="small", methods=("synonym",))
    document = run_synonym_study(options, {"agentpoison_strategyqa": frame}, embedder, tmp_path, command="pytest")
    assert [r["method"] for r in document["results"]] == ["synonym_substitution"]
    assert json.loads((tmp_path / "synonym_study.json").read_text())["stamp"]["command"] == "pytest"
    assert "| synonym | 3 |" in (tmp_path / "synonym_study.md").read_text()
