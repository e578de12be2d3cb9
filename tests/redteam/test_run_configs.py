"""Every committed run config of the attack table (configs/runs/attacks_*.yaml, `make attacks ATTACKS_CONFIG=…`)
is a valid config of its asset and names only known benchmarks, attacks and defenses."""

from pathlib import Path

import pytest
import yaml

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "runs").glob("attacks_*.yaml"))


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
