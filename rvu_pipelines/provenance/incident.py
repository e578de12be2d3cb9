"""The JSONL incident-log format: what an agent runtime emits and recovery ingests.

One JSON object per line, validated against ``configs/schemas/incident_log.schema.json``:

- ``kind: action``: an agent action (entry id, episode, action type, content, parent, timestamp,
  active adapter, optional ``contaminated`` flag);
- ``kind: adapter_loaded | adapter_unloaded | adapter_fused``: adapter lifecycle events;
- ``kind: adapter_refused``: an adapter gate refused to load an adapter (a reason code, optional detail).

Every line becomes one provenance entry. As in the paper (§3.2, and its ``load_adapter``), an
``adapter_loaded`` line is an entry produced *under* that adapter, so adapter-aware closure reaches it;
unload, fuse and refusal lines carry no adapter linkage. A refusal loads nothing: it neither counts as a
load nor needs one, and a later line naming the refused adapter still needs an ``adapter_loaded`` line.
Parsing is all-or-nothing: every line is checked (UTF-8, JSON, schema, then file-level rules: unique
entry ids, parents and adapters defined on an earlier line) and any problem raises
:class:`IncidentValidationError` listing file, line and field for each one. References the file does
not define are left for the store to resolve before it writes anything.

Logs come from outside, so nothing in them is trusted: a value later stages cannot hold (an
overflowing number, deep nesting, a lone surrogate) is a validation problem like any other; a value
quoted in a message is cut to a few hundred characters; at most :data:`MAX_ISSUES` problems are
listed; a UTF-16 file gets one problem telling how to re-encode it instead of one per line.
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

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.bounded_io import read_input_file, truncate_for_message
from rvu_pipelines.errors import IncidentValidationError
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.paths import config_dir, project_root
from rvu_pipelines.provenance.canonical import canonical_bytes, canonical_dumps, strict_loads
from rvu_pipelines.text_rules import InvalidTextError, text_problem

SCHEMA_RELATIVE_PATH = Path("schemas") / "incident_log.schema.json"
LIFECYCLE_ACTION_TYPES = {
    "adapter_loaded": "adapter_load",
    "adapter_unloaded": "adapter_unload",
    "adapter_fused": "adapter_fuse",
    "adapter_refused": "adapter_refuse",
}
MAX_ISSUES = 200  # problems listed; validation stops at the next one
MAX_EXTRA_FIELDS_LISTED = 10  # unexpected fields named one by one on a line
QUOTE_LIMIT = 200  # characters of a value quoted in a message
FIELD_LIMIT = 80  # characters of a field name
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_FIX_HINTS = {
    "type": "write a value of the type named",
    "pattern": "write a value matching that pattern",
    "maxLength": "shorten the value",
    "minLength": "give a non-empty value",
    "minimum": "use a value in range",
    "maximum": "use a value in range",
    "enum": "use one of the values listed",
    "const": "use the value named",
    "not": "the adapter_* action types are reserved for lifecycle lines; write such a line with an adapter_* kind",
    "anyOf": "write a value of the form the schema describes",
}


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
    reason: str | None = None  # an adapter_refused line's reason code

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
    def adapters_refused(self) -> list[IncidentRecord]:
        return [record for record in self.records if record.kind == "adapter_refused"]

    @property
    def last_timestamp(self) -> float:
        return max(record.timestamp for record in self.records)

    def adapter_field(self, line: int) -> str:
        """The field that names the adapter on ``line``: ``active_adapter_id`` for an action, else ``adapter_id``.

        ``external_adapters`` mixes both kinds of line, so a message about an unknown adapter asks this
        which field to name instead of assuming an action.
        """
        for record in self.records:
            if record.line == line:
                return "active_adapter_id" if record.is_action else "adapter_id"
        return "adapter_id"


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


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with its full length said (field names are shown unquoted)."""
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def _join_field(path: str, name: str) -> str:
    return ".".join(filter(None, [path, _cut(name, FIELD_LIMIT)]))


def _kind_of(error: ValidationError) -> str:
    kind = error.instance.get("kind") if isinstance(error.instance, Mapping) else None
    return f"a kind={kind} line" if isinstance(kind, str) and len(kind) <= FIELD_LIMIT else "this line"


def _missing_fields(error: ValidationError, path: str) -> list[tuple[str, str]]:
    """One (field, message) per missing field: each missing field is named on its own, not all on the first."""
    missing = [name for name in error.validator_value if name not in error.instance]
    return [(_join_field(path, name), f"required by {_kind_of(error)} but missing; add '{name}'") for name in missing]


def _extra_fields(error: ValidationError, path: str) -> list[tuple[str, str]]:
    allowed = sorted(error.schema.get("properties", {}))
    extra = sorted(name for name in error.instance if name not in allowed)
    found = [
        (
            _join_field(path, name),
            f"field {truncate_for_message(name, QUOTE_LIMIT)} is not allowed on {_kind_of(error)}; remove it or fix "
            f"its spelling (allowed: {', '.join(allowed)})",
        )
        for name in extra[:MAX_EXTRA_FIELDS_LISTED]
    ]
    if len(extra) > MAX_EXTRA_FIELDS_LISTED:
        found.append((path or "<line>", f"and {len(extra) - MAX_EXTRA_FIELDS_LISTED} more fields that are not allowed"))
    return found


def _schema_message(error: ValidationError) -> str:
    """jsonschema's message with the offending value cut short (it quotes the value whole) and a fix added."""
    message = error.message
    if isinstance(error.instance, (str, list, dict)):
        full = repr(error.instance)
        if len(full) > QUOTE_LIMIT:
            message = message.replace(full, truncate_for_message(error.instance, QUOTE_LIMIT))
    if error.validator == "not":
        message = f"{truncate_for_message(error.instance, QUOTE_LIMIT)} is not allowed here"
    message = _cut(message, 2 * QUOTE_LIMIT)
    hint = _FIX_HINTS.get(str(error.validator))
    return f"{message}; {hint}" if hint else message


def _error_problems(error: ValidationError) -> list[tuple[str, str]]:
    path = _cut(".".join(str(part) for part in error.absolute_path), FIELD_LIMIT)
    if error.validator == "required" and isinstance(error.instance, Mapping):
        return _missing_fields(error, path)
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        return _extra_fields(error, path)
    return [(path or "<line>", _schema_message(error))]


def _schema_issues(source: str, line: int, obj: Any) -> list[IncidentIssue]:
    errors = sorted(incident_validator().iter_errors(obj), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    issues: list[IncidentIssue] = []
    seen: set[tuple[str, str]] = set()
    for error in errors:
        if error.validator in ("if", "allOf"):
            continue
        for key in _error_problems(error):
            if key not in seen:
                seen.add(key)
                issues.append(IncidentIssue(source, line, key[0], key[1]))
    return issues


def _lifecycle_content(obj: Mapping[str, Any]) -> str:
    """The content stored for a lifecycle entry: its adapter fields as canonical JSON."""
    keys = ("kind", "adapter_id", "adapter_name", "adapter_hash", "source", "parent_adapter_id", "influence")
    return canonical_dumps({key: obj[key] for key in (*keys, "reason", "detail") if key in obj})


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
        source=obj.get("source", "local" if kind == "adapter_loaded" else None),
        parent_adapter_id=obj.get("parent_adapter_id"),
        influence=float(influence) if influence is not None else None,
        reason=obj.get("reason"),
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
        if record.kind == "adapter_refused":  # names an adapter that never ran: no load to find, none made
            continue
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


def _encoding_issue(data: bytes, source: str) -> IncidentIssue | None:
    """A UTF-16 (or UTF-32) file fails on every line; say once what it is and how to re-encode it."""
    head = data[:4096]
    if head.startswith(UTF16_BOMS):
        found = f"starts with the UTF-16 (or UTF-32) byte-order mark {head[:2].hex(' ').upper()}"
    elif len(head) >= 2 and head.count(0) * 4 >= len(head):
        found = f"has {head.count(0)} NUL bytes in its first {len(head)}, as UTF-16 text does"
    else:
        return None
    return IncidentIssue(
        source,
        1,
        "<file>",
        f"the file {found}; incident logs must be UTF-8: re-encode it, e.g. "
        "`iconv -f UTF-16 -t UTF-8 in.jsonl > out.jsonl`, or write it with encoding='utf-8'",
    )


def _parse_line(source: str, index: int, raw: bytes) -> tuple[IncidentRecord | None, list[IncidentIssue]]:
    """One line: a record, or its problems (never an exception: a hostile line is a problem like any other)."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [
            IncidentIssue(source, index, "<line>", f"not valid UTF-8 at byte {exc.start}; write the log as UTF-8 text")
        ]
    if not text.strip():
        return None, []
    if text.startswith("\ufeff"):
        return None, [
            IncidentIssue(source, index, "<line>", "starts with a byte-order mark; save as UTF-8 without BOM")
        ]
    try:
        obj = strict_loads(text)
    except ValueError as exc:
        return None, [IncidentIssue(source, index, "<json>", f"not valid JSON: {_cut(str(exc), 2 * QUOTE_LIMIT)}")]
    line_issues = _schema_issues(source, index, obj)
    if line_issues:
        return None, line_issues
    try:
        return _record(index, obj), []
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a value canonical JSON cannot hold
        message = f"cannot be stored ({type(exc).__name__}: {_cut(str(exc), 2 * QUOTE_LIMIT)})"
        return None, [IncidentIssue(source, index, "<line>", message)]


def _invalid(source: str, issues: list[IncidentIssue], complete: bool) -> IncidentValidationError:
    """The error for ``issues``; when validation stopped at the cap it says so instead of a false count."""
    issues.sort(key=lambda issue: (issue.line, issue.field, issue.message))
    error = IncidentValidationError(source, issues)
    if not complete:
        shown = "\n".join(f"  {issue}" for issue in issues[:50])
        error.args = (
            f"Incident log {source} is invalid (the first {len(issues)} of at least {len(issues) + 1} problems; "
            f"validation stopped there, the {min(50, len(issues))} first are shown); nothing was ingested:\n"
            f"{shown}\n  ... fix these and validate again to see the rest",
        )
    return error


def parse_incident(data: bytes, source: str) -> IncidentLog:
    """Validate every line of ``data`` (named ``source`` in messages); raise on any problem.

    Raises only :class:`IncidentValidationError`, whatever the bytes are.
    """
    encoding = _encoding_issue(data, source)
    if encoding is not None:
        raise _invalid(source, [encoding], complete=True)
    issues: list[IncidentIssue] = []
    records: list[IncidentRecord] = []
    complete = True
    for index, raw in enumerate(data.split(b"\n"), start=1):
        record, line_issues = _parse_line(source, index, raw)
        if len(issues) + len(line_issues) > MAX_ISSUES:
            issues.extend(line_issues[: MAX_ISSUES - len(issues)])
            complete = False
            break
        issues.extend(line_issues)
        if record is not None:
            records.append(record)
    if not records and not issues:
        issues.append(
            IncidentIssue(source, 1, "<file>", "the incident log holds no records; write one JSON object per line")
        )
    file_issues, external_parents, external_adapters = _file_issues(source, records) if complete else ([], {}, {})
    room = MAX_ISSUES - len(issues)
    complete = complete and len(file_issues) <= room
    issues.extend(file_issues[:room])
    if issues:
        raise _invalid(source, issues, complete)
    return IncidentLog(
        path=source,
        sha256=sha256_bytes(data),
        records=tuple(records),
        external_parents={key: tuple(value) for key, value in sorted(external_parents.items())},
        external_adapters={key: tuple(value) for key, value in sorted(external_adapters.items())},
    )


def load_incident(path: Path | str) -> IncidentLog:
    """Read and validate an incident log file; never returns partial data.

    Raises InputFileError when the path is not a readable regular file within RVU_MAX_INPUT_MB (a FIFO
    or /dev/zero is refused, not read), IncidentValidationError when its content is invalid.
    """
    path = Path(path)
    return parse_incident(read_input_file(path, what="incident log"), str(path))


def incident_line(record: Mapping[str, Any]) -> str:
    """One incident-log line as the writers in this project emit it (sorted keys, compact)."""
    return json.dumps(dict(record), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def write_incident(records: Iterable[Mapping[str, Any]], path: Path | str) -> Path:
    """Write records as a JSONL incident log (one object per line, trailing newline).

    Every line is checked and serialised before the file is touched, and the file is replaced in one
    step, so a record that cannot be written (a lone surrogate) raises with the old file intact."""
    lines = []
    for number, record in enumerate(records, start=1):
        for field_name, value in sorted(record.items()):
            if isinstance(value, str) and (problem := text_problem(value)) is not None:
                raise InvalidTextError(
                    f"incident record {number} (entry {record.get('entry_id')!a}), field '{field_name}', cannot be "
                    f"written to {path}: {problem}. Nothing was written."
                )
        lines.append(incident_line(record) + "\n")
    return write_atomically(path, "".join(lines))
