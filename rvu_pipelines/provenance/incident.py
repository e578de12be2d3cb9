"""The JSONL incident-log format: what an agent runtime emits and recovery ingests.

One JSON object per line, validated against ``configs/schemas/incident_log.schema.json``:

- ``kind: action``: an agent action (entry id, episode, action type, content, parent, timestamp,
  active adapter, optional ``contaminated`` flag);
- ``kind: adapter_loaded | adapter_unloaded | adapter_fused``: adapter lifecycle events.

Every line becomes one provenance entry. As in the paper (§3.2, and its ``load_adapter``), an
``adapter_loaded`` line is an entry produced *under* that adapter, so adapter-aware closure reaches
it; unload and fuse lines carry no adapter linkage. Parsing is all-or-nothing: every line is checked
(UTF-8, JSON, schema, then file-level rules: unique entry ids, parents and adapters defined on an
earlier line) and any problem raises :class:`IncidentValidationError` listing file, line and field
for each one. References the file does not define are left for the store to resolve before it
writes anything.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from rvu_pipelines.errors import IncidentValidationError
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.paths import config_dir, project_root
from rvu_pipelines.provenance.canonical import canonical_bytes, canonical_dumps, strict_loads

SCHEMA_RELATIVE_PATH = Path("schemas") / "incident_log.schema.json"
LIFECYCLE_ACTION_TYPES = {
    "adapter_loaded": "adapter_load",
    "adapter_unloaded": "adapter_unload",
    "adapter_fused": "adapter_fuse",
}
MAX_ISSUES = 1000


@dataclass(frozen=True)
class IncidentIssue:
    """One problem in an incident log: where it is (file, 1-based line, field) and what is wrong."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: field '{self.field}': {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "field": self.field, "message": self.message}


@dataclass(frozen=True)
class IncidentRecord:
    """One validated line, normalised to the provenance columns it becomes."""

    line: int
    kind: str
    entry_id: str
    episode_id: str
    action_type: str
    content: str
    parent_id: str | None
    timestamp: float
    active_adapter_id: str | None
    contaminated: bool
    record_hash: str
    adapter_id: str | None = None
    adapter_name: str | None = None
    adapter_hash: str | None = None
    source: str | None = None
    parent_adapter_id: str | None = None
    influence: float | None = None

    @property
    def is_action(self) -> bool:
        return self.kind == "action"


@dataclass(frozen=True)
class IncidentLog:
    """A fully validated incident log. ``sha256`` is of the file bytes; it names the incident."""

    path: str
    sha256: str
    records: tuple[IncidentRecord, ...]
    # references this file does not define itself; the store must know them (entry/adapter id -> lines)
    external_parents: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    external_adapters: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def incident_id(self) -> str:
        return f"inc-{self.sha256[:16]}"

    @property
    def entry_ids(self) -> list[str]:
        return [record.entry_id for record in self.records]

    @property
    def episodes(self) -> list[str]:
        return sorted({record.episode_id for record in self.records})

    @property
    def adapters_loaded(self) -> list[IncidentRecord]:
        return [record for record in self.records if record.kind == "adapter_loaded"]

    @property
    def last_timestamp(self) -> float:
        return max(record.timestamp for record in self.records)


def schema_path() -> Path:
    """The incident-log JSON Schema: the config folder's copy if it has one, else the repository's."""
    candidate = config_dir() / SCHEMA_RELATIVE_PATH
    return candidate if candidate.is_file() else project_root() / "configs" / SCHEMA_RELATIVE_PATH


@functools.lru_cache(maxsize=4)
def _validator(path: str) -> Draft202012Validator:
    schema = json.loads(Path(path).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def incident_validator() -> Draft202012Validator:
    return _validator(str(schema_path()))


def _error_field(error: ValidationError) -> str:
    path = ".".join(str(part) for part in error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [name for name in error.validator_value if name not in error.instance]
        if missing:
            return ".".join(filter(None, [path, missing[0]]))
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(name for name in error.instance if name not in allowed)
        if extra:
            return ".".join(filter(None, [path, extra[0]]))
    return path or "<line>"


def _schema_issues(source: str, line: int, obj: Any) -> list[IncidentIssue]:
    errors = sorted(incident_validator().iter_errors(obj), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    issues: list[IncidentIssue] = []
    seen: set[tuple[str, str]] = set()
    for error in errors:
        if error.validator in ("if", "allOf"):
            continue
        key = (_error_field(error), error.message)
        if key not in seen:
            seen.add(key)
            issues.append(IncidentIssue(source, line, key[0], key[1]))
    return issues


def _lifecycle_content(obj: Mapping[str, Any]) -> str:
    """The content stored for a lifecycle entry: its adapter fields as canonical JSON."""
    keys = ("kind", "adapter_id", "adapter_name", "adapter_hash", "source", "parent_adapter_id", "influence")
    return canonical_dumps({key: obj[key] for key in keys if key in obj})


def _record(line: int, obj: Mapping[str, Any]) -> IncidentRecord:
    kind = obj["kind"]
    record_hash = sha256_bytes(canonical_bytes(obj))
    if kind == "action":
        return IncidentRecord(
            line=line,
            kind=kind,
            entry_id=obj["entry_id"],
            episode_id=obj["episode_id"],
            action_type=obj["action_type"],
            content=obj["content"],
            parent_id=obj.get("parent_id"),
            timestamp=float(obj["timestamp"]),
            active_adapter_id=obj.get("active_adapter_id"),
            contaminated=bool(obj.get("contaminated", False)),
            record_hash=record_hash,
        )
    influence = obj.get("influence")
    return IncidentRecord(
        line=line,
        kind=kind,
        entry_id=obj["entry_id"],
        episode_id=obj["episode_id"],
        action_type=LIFECYCLE_ACTION_TYPES[kind],
        content=_lifecycle_content(obj),
        parent_id=obj.get("parent_id"),
        timestamp=float(obj["timestamp"]),
        active_adapter_id=obj["adapter_id"] if kind == "adapter_loaded" else None,
        contaminated=False,
        record_hash=record_hash,
        adapter_id=obj["adapter_id"],
        adapter_name=obj.get("adapter_name"),
        adapter_hash=obj.get("adapter_hash"),
        source=obj.get("source", "local") if kind == "adapter_loaded" else None,
        parent_adapter_id=obj.get("parent_adapter_id"),
        influence=float(influence) if influence is not None else None,
    )


def _file_issues(source: str, records: list[IncidentRecord]) -> tuple[list[IncidentIssue], dict, dict]:
    """Rules that need the whole file: unique ids, causal order, adapter lifecycle order."""
    issues: list[IncidentIssue] = []
    first_line: dict[str, int] = {}
    for record in records:
        if record.entry_id in first_line:
            issues.append(
                IncidentIssue(
                    source,
                    record.line,
                    "entry_id",
                    f"duplicate entry id {record.entry_id!r} (first on line {first_line[record.entry_id]})",
                )
            )
        else:
            first_line[record.entry_id] = record.line
    external_parents: dict[str, list[int]] = {}
    external_adapters: dict[str, list[int]] = {}
    loaded: dict[str, int] = {}
    unloaded: dict[str, int] = {}
    for record in records:
        parent = record.parent_id
        if parent is not None:
            if parent == record.entry_id:
                issues.append(IncidentIssue(source, record.line, "parent_id", "an entry cannot be its own parent"))
            elif parent in first_line:
                if first_line[parent] > record.line:
                    issues.append(
                        IncidentIssue(
                            source,
                            record.line,
                            "parent_id",
                            f"parent {parent!r} is defined later, on line {first_line[parent]}; "
                            "lines must be in causal order",
                        )
                    )
            else:
                external_parents.setdefault(parent, []).append(record.line)
        if record.kind == "adapter_loaded":
            assert record.adapter_id is not None
            if record.adapter_id in loaded:
                issues.append(
                    IncidentIssue(
                        source,
                        record.line,
                        "adapter_id",
                        f"adapter {record.adapter_id!r} is already loaded on line {loaded[record.adapter_id]}",
                    )
                )
            else:
                loaded[record.adapter_id] = record.line
            continue
        adapter = record.active_adapter_id if record.is_action else record.adapter_id
        if adapter is None:
            continue
        field_name = "active_adapter_id" if record.is_action else "adapter_id"
        if adapter in unloaded:
            issues.append(
                IncidentIssue(
                    source, record.line, field_name, f"adapter {adapter!r} was unloaded on line {unloaded[adapter]}"
                )
            )
        elif adapter not in loaded:
            external_adapters.setdefault(adapter, []).append(record.line)
        if record.kind == "adapter_unloaded":
            unloaded[adapter] = record.line
    return issues, external_parents, external_adapters


def parse_incident(data: bytes, source: str) -> IncidentLog:
    """Validate every line of ``data`` (named ``source`` in messages); raise on any problem."""
    issues: list[IncidentIssue] = []
    records: list[IncidentRecord] = []
    lines = data.split(b"\n")
    for index, raw in enumerate(lines, start=1):
        if len(issues) >= MAX_ISSUES:
            break
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            issues.append(IncidentIssue(source, index, "<line>", f"not valid UTF-8 at byte {exc.start}"))
            continue
        if not text.strip():
            continue
        try:
            obj = strict_loads(text)
        except ValueError as exc:
            issues.append(IncidentIssue(source, index, "<json>", f"not valid JSON: {exc}"))
            continue
        line_issues = _schema_issues(source, index, obj)
        if line_issues:
            issues.extend(line_issues)
            continue
        records.append(_record(index, obj))
    if not records and not issues:
        issues.append(IncidentIssue(source, 1, "<file>", "the incident log holds no records"))
    file_issues, external_parents, external_adapters = _file_issues(source, records)
    issues.extend(file_issues)
    if issues:
        issues.sort(key=lambda issue: (issue.line, issue.field, issue.message))
        raise IncidentValidationError(source, issues)
    return IncidentLog(
        path=source,
        sha256=sha256_bytes(data),
        records=tuple(records),
        external_parents={key: tuple(value) for key, value in sorted(external_parents.items())},
        external_adapters={key: tuple(value) for key, value in sorted(external_adapters.items())},
    )


def load_incident(path: Path | str) -> IncidentLog:
    """Read and validate an incident log file. Raises IncidentValidationError; never returns partial data."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise IncidentValidationError(
            str(path), [IncidentIssue(str(path), 0, "<file>", f"cannot read: {exc.strerror or exc}")]
        ) from exc
    return parse_incident(data, str(path))


def incident_line(record: Mapping[str, Any]) -> str:
    """One incident-log line as the writers in this project emit it (sorted keys, compact)."""
    return json.dumps(dict(record), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def write_incident(records: Iterable[Mapping[str, Any]], path: Path | str) -> Path:
    """Write records as a JSONL incident log (one object per line, trailing newline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(incident_line(record) + "\n" for record in records), encoding="utf-8")
    return path
