"""Typed form of configs/datasets.yaml: what each data set's files are and how many rows it has."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DerivedTransform = Literal["tofu_eval_log_to_qa", "json_records_to_jsonl"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MirrorFile(_Strict):
    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class PublicSource(_Strict):
    """Where the data set lives publicly; used when no local mirror is configured."""

    kind: Literal["hf", "github", "pypi"]
    url: str
    repo: str | None = None
    revision: str = "main"
    hf_config: str | None = None
    splits: list[str] = []
    package: str | None = None
    version: str | None = None
    paths: dict[str, str] = {}
    derived: dict[str, DerivedTransform] = {}

    @model_validator(mode="after")
    def _fields_for_kind(self) -> PublicSource:
        if self.kind in ("hf", "github") and not self.repo:
            raise ValueError(f"public.repo is required for kind '{self.kind}'")
        if self.kind == "pypi" and not (self.package and self.version):
            raise ValueError("public.package and public.version are required for kind 'pypi'")
        if self.kind in ("github", "pypi") and not self.paths:
            raise ValueError(f"public.paths is required for kind '{self.kind}'")
        unknown = set(self.derived) - set(self.paths)
        if unknown:
            raise ValueError(f"public.derived names files not in public.paths: {sorted(unknown)}")
        return self

    def describe(self) -> str:
        if self.kind == "hf":
            config = f" (config {self.hf_config})" if self.hf_config else ""
            return f"HuggingFace dataset {self.repo}{config} @ {self.revision} <{self.url}>"
        if self.kind == "github":
            return f"GitHub {self.repo} @ {self.revision} <{self.url}>"
        return f"PyPI {self.package}=={self.version} <{self.url}>"


class GroupCount(_Strict):
    """Published rows per group, e.g. by=[split] counts={train: 546, test: 116}."""

    by: list[str]
    counts: dict[str, int]

    def key_of(self, values: tuple[object, ...]) -> str:
        return "/".join(str(value) for value in values)


class DatasetSpec(_Strict):
    name: str = ""
    title: str
    licence: str
    description: str
    folder: str
    files: list[MirrorFile]
    public: PublicSource
    rows: int
    group_counts: list[GroupCount] = []
    distinct_counts: dict[str, int] = {}
    required: bool = True

    def file_sha256(self) -> dict[str, str]:
        return {f.path: f.sha256 for f in self.files}


class SuiteCounts(_Strict):
    user_tasks: int
    injection_tasks: int


class AgentDojoSpec(_Strict):
    """AgentDojo's task suites, read from the installed package at a pinned benchmark version."""

    package_version: str
    benchmark_version: str
    licence: str
    url: str
    suites: dict[str, SuiteCounts]


class DatasetCatalog(_Strict):
    datasets: dict[str, DatasetSpec]
    agentdojo: AgentDojoSpec

    @model_validator(mode="after")
    def _name_entries(self) -> DatasetCatalog:
        for name, spec in self.datasets.items():
            spec.name = name
        return self

    def get(self, name: str) -> DatasetSpec:
        try:
            return self.datasets[name]
        except KeyError:
            from rvu_pipelines.errors import ConfigError

            raise ConfigError(
                f"Unknown data set '{name}'. Allowed values: {', '.join(sorted(self.datasets))}"
            ) from None
