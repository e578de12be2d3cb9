"""The cluster recipe (deploy/): the instance it renders passes Dagster's own config schemas, and the Helm values,
the ConfigMap, the Dockerfile and the local scale profile agree with each other and with the settings."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_the_cluster_instance_passes_dagsters_schemas() -> None:
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_k8s import K8sRunLauncher

    config, _ = dagster_instance_config(str(DEPLOY / "k8s"))  # the instance schema, as `dagster` loads it
    for section, cls in (("run_launcher", K8sRunLauncher), ("run_coordinator", QueuedRunCoordinator)):
        assert config[section]["class"] == cls.__name__
        result = process_config(cls.config_type(), config[section]["config"])
        assert result.success, [error.message for error in result.errors]
    broken = {**config["run_launcher"]["config"], "job_namespce": "typo"}
    assert not process_config(K8sRunLauncher.config_type(), broken).success  # the check can fail


def test_helm_values_agree_with_the_instance_the_image_and_the_scale_profile() -> None:
    from rvu_pipelines.scale.dagster_instance import instance_config

    values, instance = _yaml(DEPLOY / "helm" / "values.yaml"), _yaml(DEPLOY / "k8s" / "dagster.yaml")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["image"]["tag"] == version
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "assets.definitions"]
    limits = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"]
    local = instance_config("postgresql://x@y/z")["run_coordinator"]["config"]["tag_concurrency_limits"]
    assert limits == local == instance["run_coordinator"]["config"]["tag_concurrency_limits"]
    monitoring = values["dagsterDaemon"]["runMonitoring"]
    assert (
        instance_config("postgresql://x@y/z")["run_monitoring"]
        == instance["run_monitoring"]
        == {
            "enabled": monitoring["enabled"],
            "max_runtime_seconds": monitoring["maxRuntimeSeconds"],
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
        }
    )
    retries = values["dagsterDaemon"]["runRetries"]
    assert (
        instance_config("postgresql://x@y/z")["run_retries"]
        == instance["run_retries"]
        == {
            "enabled": retries["enabled"],
            "max_retries": retries["maxRetries"],
            "retry_on_asset_or_op_failure": retries["retryOnAssetOrOpFailure"],
        }
    )
    launcher = instance["run_launcher"]["config"]
    k8s = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert k8s["jobNamespace"] == launcher["job_namespace"] and k8s["resources"] == launcher["resources"]
    assert [m["name"] for m in k8s["envConfigMaps"]] == launcher["env_config_maps"]
    assert values["global"]["postgresqlSecretName"] == launcher["postgres_password_secret"]
    assert values["postgresql"]["postgresqlDatabase"] == instance["storage"]["postgres"]["postgres_db"]["db_name"]
    config_map = _yaml(DEPLOY / "k8s" / "rvu-env.yaml")
    assert config_map["metadata"]["name"] in launcher["env_config_maps"]


def test_the_configmap_sets_only_declared_settings_with_valid_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from rvu_pipelines.settings import SETTINGS, env_value

    data = _yaml(DEPLOY / "k8s" / "rvu-env.yaml")["data"]
    declared = {setting.name for setting in SETTINGS}
    assert set(data) <= declared, set(data) - declared
    for name, value in data.items():
        monkeypatch.setenv(name, str(value))
        assert env_value(name) == str(value)  # a choice outside its choices would raise here


def test_the_image_carries_every_package_and_pins_torch_like_setup() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for pattern in packages["include"]:
        assert f"COPY {pattern.rstrip('*')} " in dockerfile, pattern
    setup_torch = re.search(r"TORCH_VERSION=(\S+)", (REPO / "scripts" / "setup.sh").read_text())
    assert setup_torch and f'"torch=={setup_torch.group(1)}"' in dockerfile
    assert "-c requirements/constraints.txt" in dockerfile and "build_llama_cpp.py wheel" in dockerfile
