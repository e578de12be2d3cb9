"""Every committed run config of the attack table (configs/runs/*.yaml with attack_table_full, `make attacks
ATTACKS_CONFIG=…`) is a valid config of its asset, names only known benchmarks, attacks and defenses, and keeps its
table in a folder of its own."""

from pathlib import Path

import pytest
import yaml

RUNS = Path(__file__).resolve().parents[2] / "configs" / "runs"
CONFIGS = sorted(p for p in RUNS.glob("*.yaml") if "attack_table_full" in p.read_text())


def test_there_are_run_configs():
    assert CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_run_config_is_a_valid_attack_table_plan(path):
    from assets.attack_study import AttackTableConfig
    from rvu_pipelines.redteam.table import TablePlan

    raw = yaml.safe_load(path.read_text())
    assert set(raw) == {"ops"} and set(raw["ops"]) == {"attack_table_full"}
    config = AttackTableConfig(**raw["ops"]["attack_table_full"]["config"])
    plan = TablePlan(
        tuple(config.benchmarks), tuple(config.attacks), tuple(config.defenses), config.per_benchmark, config.sample
    )
    assert plan.attacks and plan.defenses


def test_each_run_config_names_its_own_folder() -> None:
    names = [yaml.safe_load(p.read_text())["ops"]["attack_table_full"]["config"]["name"] for p in CONFIGS]
    assert names == [p.stem.removeprefix("attacks_") for p in CONFIGS]


@pytest.mark.parametrize("name", ["../elsewhere", "Table 1", "", "a/b"])
def test_a_name_that_is_not_a_plain_folder_name_is_refused(name: str) -> None:
    from pydantic import ValidationError

    from assets.attack_study import AttackTableConfig

    with pytest.raises(ValidationError, match="name"):
        AttackTableConfig(name=name)


def test_a_tables_stamp_names_the_run_config_that_makes_it() -> None:
    """The stamp beside a run's table (``rvu report`` reads it) gives the command that remakes that very table."""
    from assets.attack_study import run_command

    for path in CONFIGS:
        name = yaml.safe_load(path.read_text())["ops"]["attack_table_full"]["config"]["name"]
        assert run_command(name) == f"make attacks ATTACKS_CONFIG=configs/runs/{path.name}"
    assert run_command("made-in-the-ui") == "make attacks (attack_table_full config name: made-in-the-ui)"
