"""Results of deterministic steps, reused when nothing they depend on changed (a re-run of ``make run``).

A memo key is sha256 over: the code the step runs (``code_closure.code_digest`` of the step's module: its own source
and every first-party module it reaches by import), the config files it reads (every file in the config folder
unless the step names its own), the name and version of every installed distribution, every ``RVU_*`` environment
variable, and the caller's parts (parameters, digests of input tables, model sha256s). An edit to another step's
code keeps this step's results. A result is stored as JSON with the sha256 of each file it points to; a file that
changed or vanished since makes it a miss, and so does anything unreadable. ``RVU_REUSE_RESULTS=0`` turns reuse off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.code_closure import code_digest
from rvu_pipelines.hashing import sha256_file
from rvu_pipelines.paths import config_dir, state_dir
from rvu_pipelines.settings import platform_variables, reuse_results

log = logging.getLogger(__name__)


def _json_default(value: Any) -> Any:
    """numpy scalars and arrays, paths and sets as JSON types; anything else is refused, never ``str()``-ed."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def json_roundtrip(value: Any) -> Any:
    """``value`` with the types a reused result will have (lists for tuples, floats for numpy floats, ...)."""
    return json.loads(json.dumps(value, default=_json_default))


def frame_digest(frame: pl.DataFrame) -> str:
    """sha256 of a table's schema and row hashes (polars' hash is version-bound: its version is in every key)."""
    digest = hashlib.sha256(json.dumps([[name, str(dtype)] for name, dtype in frame.schema.items()]).encode())
    if frame.height:
        for seed in (0, 1):  # two 64-bit row hashes: 128 bits per row
            digest.update(frame.hash_rows(seed=seed).to_numpy().tobytes())
    return digest.hexdigest()


def _tree_digest(paths: Sequence[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        relative = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        digest.update(len(relative).to_bytes(8, "big") + relative + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


@functools.cache
def installed_distributions() -> tuple[tuple[str, str], ...]:
    """(name, version) of every installed distribution: an upgraded torch or llama-cpp-python is a change."""
    found = {(str(d.metadata["Name"] or "").lower(), str(d.version)) for d in importlib.metadata.distributions()}
    return tuple(sorted(found))


def environment_digest(code: str, code_root: Path | None = None, configs: Sequence[str] | None = None) -> str:
    """Everything outside the caller's parts that a result of the step in module ``code`` may depend on.
    ``configs``: the config files (relative to the config folder) the step reads; None: every one of them."""
    root = config_dir()
    files = (
        [p for p in root.rglob("*") if p.is_file()]
        if configs is None
        else [root / name for name in configs if (root / name).is_file()]
    )
    material = {
        "code": code_digest(code, code_root),
        "configs": [sorted(configs) if configs is not None else "all", _tree_digest(files, root)],
        "libraries": installed_distributions(),
        "env": platform_variables(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ResultMemo:
    """JSON results under ``root/<name>/<key>.json`` (default root: the state folder's ``result_memo``).
    ``code_root``: where the step modules' sources are (default: where each step module was imported from)."""

    root: Path
    code_root: Path | None = None

    @classmethod
    def default(cls) -> ResultMemo:
        return cls(state_dir() / "result_memo")

    @staticmethod
    def enabled() -> bool:
        return reuse_results()

    def key(self, parts: Mapping[str, Any], *, code: str, configs: Sequence[str] | None = None) -> str:
        """The key of a result of the step defined in module ``code`` (e.g. the asset's ``__name__``).
        ``configs``: the only config files the result depends on (a step whose parts already carry what it reads
        of the configs names none, so an edit elsewhere in them keeps its results); None: all of them."""
        environment = environment_digest(code, self.code_root, configs)
        material = json.dumps({"environment": environment, "parts": parts}, sort_keys=True, default=str)
        return hashlib.sha256(material.encode()).hexdigest()

    def _path(self, name: str, key: str) -> Path:
        return self.root / name / f"{key}.json"

    def load(self, name: str, key: str) -> dict[str, Any] | None:
        """The stored value, or None (no entry, unreadable, or a file it points to changed or vanished)."""
        if not self.enabled():
            return None
        path = self._path(name, key)
        try:
            stored = json.loads(path.read_text())
            for file, digest in stored["files"].items():
                if not Path(file).is_file() or sha256_file(Path(file)) != digest:
                    log.info("result memo %s: %s changed since it was stored; computing again", name, file)
                    return None
            return dict(stored["value"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def entry(
        self, name: str, parts: Mapping[str, Any], *, code: str, configs: Sequence[str] | None = None
    ) -> MemoEntry:
        """The entry of step ``name``, defined in module ``code``, for these parts (the key is computed once)."""
        return MemoEntry(self, name, self.key(parts, code=code, configs=configs))

    def save(self, name: str, key: str, value: Mapping[str, Any], files: Sequence[Path] = ()) -> None:
        """Store ``value`` (JSON-serialisable) with the sha256 of each file it relies on; atomic."""
        path = self._path(name, key)
        body = {"value": dict(value), "files": {str(Path(f).resolve()): sha256_file(Path(f)) for f in files}}
        try:
            text = json.dumps(body, sort_keys=True, default=_json_default)
        except (TypeError, ValueError) as exc:  # a result we cannot store faithfully is computed again next time
            log.warning("result memo %s: not stored (%s)", name, exc)
            return
        write_atomically(path, text, fsync=False)  # a memo lost to a power cut is only computed again


@dataclass(frozen=True)
class MemoEntry:
    """One step's memo slot: ``load()`` before computing, ``save()`` after."""

    memo: ResultMemo
    name: str
    key: str

    def load(self) -> dict[str, Any] | None:
        return self.memo.load(self.name, self.key)

    def save(self, value: Mapping[str, Any], files: Sequence[Path] = ()) -> dict[str, Any]:
        """Store ``value``; returns it with the types a later ``load()`` gives (lists for tuples, floats for
        numpy floats), so a step goes on with the same value whether it computed or reused it."""
        self.memo.save(self.name, self.key, value, files)
        try:
            return dict(json_roundtrip(value))
        except (TypeError, ValueError):  # not storable (save said so): the value as computed
            return dict(value)


def reuse_message(stored: Mapping[str, Any]) -> str:
    """The log line of a reused result (every stored result names the MLflow run that computed it)."""
    return f"nothing changed since MLflow run {stored['mlflow_run_id']}: reusing its result"
