"""The one table of environment variables: parsing, validation, and README rendered from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.settings import SETTINGS, env_flag, env_value, is_offline, markdown_table

REPO = Path(__file__).resolve().parents[2]


def test_switches_choices_and_offline(monkeypatch) -> None:
    for name in ("RVU_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert is_offline() is False
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "TRUE")
    assert is_offline() is True
    monkeypatch.setenv("RVU_LLAMA_EXTRA_BUFTS", "maybe")
    with pytest.raises(ConfigError, match="RVU_LLAMA_EXTRA_BUFTS='maybe' is not a switch"):
        env_flag("RVU_LLAMA_EXTRA_BUFTS")
    monkeypatch.setenv("RVU_LLM_BACKEND", "vllm")
    with pytest.raises(ConfigError, match="llama_cpp, openai_compatible"):
        env_value("RVU_LLM_BACKEND")
    monkeypatch.setenv("RVU_LLM_BACKEND", "")
    assert env_value("RVU_LLM_BACKEND") is None  # empty means unset
    with pytest.raises(KeyError, match="not declared"):
        env_value("RVU_NOT_A_SETTING")


def test_readme_shows_the_table() -> None:
    assert markdown_table() in (REPO / "README.md").read_text()


def test_the_library_reads_the_environment_only_through_settings() -> None:
    """os.environ / os.getenv reads outside settings.py must be declared settings read here, or not exist.

    Passing the environment on to a child process (``{**os.environ, ...}``) is not a read."""
    declared = {s.name for s in SETTINGS}
    offenders = []
    for path in sorted((REPO / "rvu_pipelines").rglob("*.py")):
        if path.name in ("settings.py", "cli.py"):  # cli.py only displays current values (`rvu settings`)
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "getenv")
            ):
                target = node.func.value
                is_environ = isinstance(target, ast.Attribute) and target.attr == "environ"
                is_os = isinstance(target, ast.Name) and target.id == "os" and node.func.attr == "getenv"
                if is_environ or is_os:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    # api_key_env names a variable chosen by the user (OpenAI-compatible servers): read where it is used
    allowed = {"rvu_pipelines/models/llm.py"}
    assert [o for o in offenders if o.split(":")[0] not in allowed] == [], offenders
    assert {"RVU_HOME", "RVU_DATA_MIRROR", "RVU_LLAMA_EXTRA_BUFTS", "MLFLOW_TRACKING_URI"} <= declared
