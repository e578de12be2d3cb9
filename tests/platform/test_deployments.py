"""Each deployment binds every resource the assets name, with the implementation its environment asks for.

The resource sets are built and initialised the way Dagster does at run time (``build_resources``), so
an ``EnvVar`` is resolved from the environment and a resource that cannot be built fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import Definitions, build_resources

from assets.attacks import attack_assets
from assets.datasets import dataset_assets
from assets.detectors import detector_assets
from assets.memory import memory_assets
from assets.models import model_assets
from assets.recovery import recovery_assets
from resources import (
    LlamaCppLLMResource,
    MirrorDatasetSourceResource,
    OpenAICompatibleLLMResource,
    PublicDatasetSourceResource,
)
from resources.deployments import DEPLOYMENTS, deployment_resources
from rvu_pipelines.data.sources import MirrorDatasetSource, PublicDatasetSource
from rvu_pipelines.errors import ConfigError, DatasetUnavailableError
from rvu_pipelines.models import OpenAICompatibleChatModel
from sensors import SCHEDULES, SENSORS

PRODUCTION_ENV = {
    "RVU_LLM_BASE_URL": "http://llm.internal:8080/v1",
    "RVU_LLM_MODEL": "qwen2.5-1.5b-instruct",
    "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000",
}
DEPLOYMENT_VARS = (
    "RVU_DEPLOYMENT",
    "RVU_DATA_MIRROR",
    "RVU_LLM_BACKEND",
    "RVU_LLM_BASE_URL",
    "RVU_LLM_MODEL",
    "RVU_LLM_EXTRA_BODY",
    "MLFLOW_TRACKING_URI",
    "RVU_INCIDENT_DIR",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in DEPLOYMENT_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _production(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in PRODUCTION_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RVU_INCIDENT_DIR", str(tmp_path / "incidents"))


def _all_assets() -> list:
    return [
        *dataset_assets(),
        *model_assets(),
        *recovery_assets(),
        *memory_assets(),
        *detector_assets(),
        *attack_assets(),
    ]


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_every_deployment_satisfies_every_asset_and_sensor(name, clean_env, tmp_path) -> None:
    clean_env.setenv("RVU_DATA_MIRROR", str(tmp_path))
    _production(clean_env, tmp_path)
    defs = Definitions(assets=_all_assets(), schedules=SCHEDULES, sensors=SENSORS, resources=deployment_resources(name))
    Definitions.validate_loadable(defs)  # raises if an asset or sensor names a resource the set lacks


def test_local_defaults_are_in_process(clean_env) -> None:
    resources = deployment_resources("local")
    assert isinstance(resources["llm"], LlamaCppLLMResource)
    assert isinstance(resources["data_source"], PublicDatasetSourceResource)
    with build_resources({"data_source": resources["data_source"]}) as built:
        assert isinstance(built.data_source.build(), PublicDatasetSource)


def test_local_follows_the_mirror_and_the_llm_backend(clean_env, tmp_path) -> None:
    clean_env.setenv("RVU_DATA_MIRROR", str(tmp_path))
    clean_env.setenv("RVU_LLM_BACKEND", "openai_compatible")
    clean_env.setenv("RVU_LLM_BASE_URL", "http://127.0.0.1:8080/v1")
    resources = deployment_resources("local")
    with build_resources({"data_source": resources["data_source"], "llm": resources["llm"]}) as built:
        source = built.data_source.build()
        assert isinstance(source, MirrorDatasetSource) and source.root == tmp_path.resolve()
        chat = built.llm.build(Path("/models/smollm2.gguf"))
    assert isinstance(chat, OpenAICompatibleChatModel)
    assert chat.base_url.startswith("http://127.0.0.1:8080") and chat.name == "smollm2.gguf"


def test_the_llm_extra_body_reaches_every_request_and_a_bad_one_is_refused(clean_env) -> None:
    clean_env.setenv("RVU_LLM_BACKEND", "openai_compatible")
    clean_env.setenv("RVU_LLM_BASE_URL", "http://127.0.0.1:8080/v1")
    clean_env.setenv("RVU_LLM_EXTRA_BODY", '{"repeat_penalty": 1}')
    with build_resources({"llm": deployment_resources("local")["llm"]}) as built:
        chat = built.llm.build(Path("/models/smollm2.gguf"))
    assert chat.extra_body == {"repeat_penalty": 1.0}
    for bad, why in (("{repeat_penalty: 1}", "not JSON"), ('{"stop": ["x"]}', "numeric"), ("[1.0]", "numeric")):
        clean_env.setenv("RVU_LLM_EXTRA_BODY", bad)
        with pytest.raises(ConfigError, match=f"RVU_LLM_EXTRA_BODY.*{why}"):
            deployment_resources("local")


def test_local_openai_backend_without_an_endpoint_is_refused(clean_env) -> None:
    clean_env.setenv("RVU_LLM_BACKEND", "openai_compatible")
    with pytest.raises(ConfigError, match="RVU_LLM_BASE_URL"):
        deployment_resources("local")


def test_production_binds_the_servers_from_the_environment(clean_env, tmp_path) -> None:
    _production(clean_env, tmp_path)
    resources = deployment_resources("production")
    assert isinstance(resources["llm"], OpenAICompatibleLLMResource)
    with build_resources({name: resources[name] for name in ("llm", "mlflow_tracker", "recovery")}) as built:
        chat = built.llm.build(Path("/models/ignored.gguf"))
        assert built.mlflow_tracker.tracking_uri == PRODUCTION_ENV["MLFLOW_TRACKING_URI"]
        assert built.recovery.folders().inbox.parent == tmp_path / "incidents"
    assert isinstance(chat, OpenAICompatibleChatModel)
    assert chat.name == PRODUCTION_ENV["RVU_LLM_MODEL"]


def test_production_names_every_missing_variable(clean_env) -> None:
    clean_env.setenv("RVU_LLM_BASE_URL", "http://llm.internal:8080/v1")
    with pytest.raises(ConfigError) as error:
        deployment_resources("production")
    message = str(error.value)
    assert "RVU_LLM_MODEL" in message and "MLFLOW_TRACKING_URI" in message and "RVU_INCIDENT_DIR" in message
    assert "RVU_LLM_BASE_URL" not in message.split("needs")[1].split("set")[0]


def test_offline_mirror_needs_a_mirror_and_stays_offline(clean_env, tmp_path) -> None:
    with pytest.raises(ConfigError, match="RVU_DATA_MIRROR"):
        deployment_resources("offline_mirror")
    clean_env.setenv("RVU_DATA_MIRROR", str(tmp_path))
    resources = deployment_resources("offline_mirror")
    assert isinstance(resources["data_source"], MirrorDatasetSourceResource)
    assert resources["model_store"].offline is True
    assert isinstance(resources["llm"], LlamaCppLLMResource)


def test_a_mirror_that_is_not_a_folder_is_refused_by_name(clean_env, tmp_path) -> None:
    missing = tmp_path / "no-such-mirror"
    with pytest.raises(DatasetUnavailableError, match="no-such-mirror"):
        MirrorDatasetSourceResource(mirror=str(missing)).build()


def test_unknown_deployment_is_refused(clean_env) -> None:
    with pytest.raises(ConfigError, match="local, offline_mirror, production"):
        deployment_resources("staging")
    clean_env.setenv("RVU_DEPLOYMENT", "staging")
    with pytest.raises(ConfigError, match="RVU_DEPLOYMENT"):
        deployment_resources()
