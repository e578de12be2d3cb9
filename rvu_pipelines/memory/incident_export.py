"""The memory monitor's own audit log as an incident log, so ``rvu recover`` closes over what it served.

The audit chain is verified first (a chain that does not re-hash exports nothing). It holds, in order,
what the monitor decided: observations (a user query, a tool output), derivations (model output from
earlier context), reads (a READ node for the value a session read), writes and promotions (accepted or
rejected, with the context nodes the value depends on), single-call and batched alike. Each becomes one
incident action, its parent the provenance edge recovery follows:

=====================  =========================  ===============================================
audit record           incident action            parent
=====================  =========================  ===============================================
OBSERVE node           user_input, tool_output,   none
                       web_content, skill_content,
                       system_input
DERIVE node            assistant_output           the newest READ among its parents, else the
                                                  newest parent
READ (accepted)        memory_retrieval           the write (or promotion) that stored the value
                                                  read; a value loaded before the log began is a
                                                  ``memory-genesis`` write
WRITE accepted         memory_write               the newest READ among its deps, else the newest
                                                  dep, else none
WRITE rejected         memory_write_rejected      as an accepted write (never stored, kept so the
                                                  certificate shows the attempt)
PROMOTE accepted       memory_promote             the write promoted
=====================  =========================  ===============================================

The incident format has one parent per entry: a derivation or write with several keeps the one through
memory (what recovery purges) and names all of them in its content. Dry runs (``batch_check``) decided
nothing and are skipped. A chain that several monitors appended to in turn (restarts over one audit file)
numbers its context nodes from 0 in each; the second run's nodes are ``node:1.<n>``, and so on.

**Seeds.** The writes an operator, or a retro-scan, flags are ``contaminated``: by ``(namespace, key)``
(every accepted write of that key) or by the sha256 of the value (that exact single-call write; batch
records carry no per-row digest). A flag that matches no accepted write is an error, never a silent
incident without seeds.

**Content.** The audit keeps digests, never values. ``contents`` (value sha256 -> text, e.g. from the
monitor's store) fills in the text the operator has; any other entry's content is a JSON stub naming its
digest, namespace and key.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rvu_pipelines.errors import MemoryMonitorError
from rvu_pipelines.memory.audit import AuditLog, AuditRecord, verify_chain
from rvu_pipelines.memory.model import Channel, NodeKind, Op, decision_of
from rvu_pipelines.provenance.entry_ids import escaped_entry_id

START = 1_718_000_000.0  # fixed clock (the audit has order, not wall time): the same log gives the same incident
GENESIS_EPISODE = "memory-genesis"
OBSERVED_ACTION = {
    Channel.USER.name: "user_input",
    Channel.TOOL.name: "tool_output",
    Channel.WEB.name: "web_content",
    Channel.SKILL.name: "skill_content",
    Channel.SYSTEM.name: "system_input",
}


@dataclass
class _Export:
    """The state of one pass over the chain: names, nodes, the write each memory slot holds now."""

    flagged_keys: frozenset[tuple[str, str]]
    flagged_values: frozenset[str]
    contents: Mapping[str, str]
    shared: str
    lines: list[dict[str, Any]] = field(default_factory=list)
    node_entry: dict[int, str] = field(default_factory=dict)
    node_kind: dict[int, str] = field(default_factory=dict)
    epoch: int = 0  # monitors that appended to this chain so far, less one
    last_node: int = -1
    holder: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, key) -> entry id of its value
    namespaces: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    seeds: list[str] = field(default_factory=list)
    matched_keys: set[tuple[str, str]] = field(default_factory=set)
    matched_values: set[str] = field(default_factory=set)
    skipped: dict[str, int] = field(default_factory=dict)

    def add(self, entry_id: str, episode: str, action: str, content: str, parent: str | None, seed: bool = False):
        line: dict[str, Any] = {
            "kind": "action",
            "entry_id": entry_id,
            "episode_id": escaped_entry_id("session", episode) if episode != GENESIS_EPISODE else episode,
            "action_type": action,
            "content": content,
            "parent_id": parent,
            "timestamp": START + len(self.lines),
        }
        if seed:
            line["contaminated"] = True
            self.seeds.append(entry_id)
        self.lines.append(line)

    def text(self, digest: str | None, **where: Any) -> str:
        if digest is not None and digest in self.contents:
            return self.contents[digest]
        return json.dumps({"value_sha256": digest, **where}, sort_keys=True, ensure_ascii=False)

    def new_node(self, node: int, kind: str) -> str:
        """The entry id of a context node. A monitor numbers its nodes from 0, so a number that does not rise
        means a new monitor appended to the chain (a restart over the same audit file): a new epoch, whose
        nodes are named apart and cannot be the parents of the earlier ones'."""
        if node <= self.last_node:
            self.epoch += 1
            self.node_entry.clear()
            self.node_kind.clear()
        self.last_node = node
        entry = f"node:{node}" if self.epoch == 0 else f"node:{self.epoch}.{node}"
        self.node_entry[node], self.node_kind[node] = entry, kind
        return entry

    def parent_of(self, nodes: Sequence[int]) -> str | None:
        """The newest READ node among ``nodes`` (memory is what recovery purges), else the newest node."""
        known = [n for n in nodes if n in self.node_entry]
        reads = [n for n in known if self.node_kind[n] == NodeKind.READ.name]
        chosen = max(reads) if reads else (max(known) if known else None)
        return None if chosen is None else self.node_entry[chosen]

    def stored(self, namespace: str, key: str) -> str:
        """The entry holding the value of (namespace, key): its last write, or a genesis line for a value
        loaded before the log began."""
        if (namespace, key) not in self.holder:
            entry = escaped_entry_id("genesis", f"{namespace}/{key}")
            self.add(entry, GENESIS_EPISODE, "memory_write", self.text(None, namespace=namespace, key=key), None)
            self.holder[(namespace, key)] = entry
        return self.holder[(namespace, key)]

    # ---------------------------------------------------------------- one record kind each

    def belief(self, payload: Mapping[str, Any]) -> None:
        node, session = int(payload["node"]), str(payload["session"])
        entry = self.new_node(node, str(payload["kind"]))
        digest = payload.get("content_sha256")
        if payload["kind"] == NodeKind.OBSERVE.name:
            action = OBSERVED_ACTION.get(str(payload["channel"]), "observed_input")
            self.add(entry, session, action, self.text(digest, channel=payload["channel"]), None)
        else:
            parents = [int(p) for p in payload["parents"]]
            content = self.text(digest, derived_from=[self.node_entry.get(p, f"node:{p}") for p in parents])
            self.add(entry, session, "assistant_output", content, self.parent_of(parents))

    def decision(self, seq: int, d: Mapping[str, Any], row: str = "") -> None:
        op, session, namespace, key = d["op"], str(d["session"]), d["namespace"], d["key"]
        where = f"{namespace}/{key}@{seq}{row}"
        if op == Op.READ.name:
            if d["accepted"] and d["node"] is not None:
                parent = self.stored(namespace, key)
                entry = self.new_node(int(d["node"]), NodeKind.READ.name)
                self.add(entry, session, "memory_retrieval", self.text(None, namespace=namespace, key=key), parent)
        elif op == Op.WRITE.name:
            deps = [int(x) for x in d["deps"]]
            digest = d.get("value_sha256")
            depends_on = [self.node_entry.get(x, f"node:{x}") for x in deps]
            content = self.text(digest, namespace=namespace, key=key, depends_on=depends_on)
            if not d["accepted"]:
                entry = escaped_entry_id("rejected", where)
                self.add(entry, session, "memory_write_rejected", content, self.parent_of(deps))
                return
            entry = escaped_entry_id("write", where)
            by_key = (namespace, key) in self.flagged_keys
            by_value = digest is not None and digest in self.flagged_values
            if by_key:
                self.matched_keys.add((namespace, key))
            if by_value:
                self.matched_values.add(str(digest))
            self.add(entry, session, "memory_write", content, self.parent_of(deps), seed=by_key or by_value)
            self.holder[(namespace, key)] = entry
        elif op == Op.PROMOTE.name and d["accepted"]:
            source = self.stored(namespace, key)
            entry = escaped_entry_id("promote", f"{self.shared}/{key}@{seq}{row}")
            self.add(entry, session, "memory_promote", self.text(None, namespace=self.shared, key=key), source)
            self.holder[(self.shared, key)] = entry

    def names(self, payload: Mapping[str, Any]) -> None:
        del self.namespaces[int(payload["namespaces_from"]) :]
        self.namespaces.extend(payload["namespaces"])
        del self.keys[int(payload["keys_from"]) :]
        self.keys.extend(payload["keys"])
        if self.namespaces:
            self.shared = self.namespaces[0]  # the monitor interns its shared namespace first

    def batch(self, record: AuditRecord) -> None:
        arrays = record.arrays()
        ptr, deps = arrays["dep_ptr"].tolist(), arrays["dep_idx"].tolist()
        for row, code in enumerate(arrays["code"].tolist()):
            decided = decision_of(int(code))
            op = Op(int(arrays["op"][row]))
            if op is Op.INTERNAL:
                continue
            node = int(arrays["node"][row])
            self.decision(
                record.seq,
                {
                    "op": op.name,
                    "accepted": decided.accepted,
                    "session": self.namespaces[int(arrays["session"][row])],
                    "namespace": self.namespaces[int(arrays["namespace"][row])],
                    "key": self.keys[int(arrays["key"][row])],
                    "node": node if node >= 0 else None,
                    "deps": deps[ptr[row] : ptr[row + 1]],
                    "value_sha256": None,
                },
                row=f".{row}",
            )


def read_audit_file(path: Path | str) -> list[AuditRecord]:
    """Every record of a DuckDB audit file (``AuditLog.open``), oldest first, opened read-only: reading a log
    never changes it."""
    import duckdb

    from rvu_pipelines.memory.audit import DuckDBAuditSink

    table = DuckDBAuditSink.TABLE
    try:
        connection = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as error:
        raise MemoryMonitorError(
            f"{path}: not a readable DuckDB file ({str(error).splitlines()[0]}); pass the memory monitor's audit "
            "database (AuditLog.open / the store's DuckDB file)"
        ) from error
    try:
        tables = {row[0] for row in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if table not in tables:
            raise MemoryMonitorError(
                f"{path}: no {table} table, so not a memory monitor's audit log; pass the file AuditLog.open wrote"
            )
        rows = connection.execute(f"SELECT seq, kind, body, prev, hash FROM {table} ORDER BY seq").fetchall()
    finally:
        connection.close()
    return [AuditRecord(int(seq), kind, bytes(body), prev, digest) for seq, kind, body, prev, digest in rows]


@dataclass(frozen=True)
class AuditExport:
    """What an export wrote: the incident file, its seeds, and what it read."""

    path: Path
    n_records: int
    n_actions: int
    seeds: tuple[str, ...]
    skipped: Mapping[str, int]


def audit_incident_records(
    records: Iterable[AuditRecord],
    *,
    flagged_keys: Collection[tuple[str, str]] = (),
    flagged_values: Collection[str] = (),
    contents: Mapping[str, str] | None = None,
    shared: str = "shared",
) -> tuple[list[dict[str, Any]], tuple[str, ...], dict[str, int]]:
    """The incident lines of an audit chain (oldest record first), its seed entry ids, and the record kinds
    skipped with their counts. Raises ``MemoryMonitorError`` when a flag matches no accepted write."""
    state = _Export(frozenset(flagged_keys), frozenset(flagged_values), contents or {}, shared)
    for record in records:
        if record.kind == "belief":
            state.belief(record.payload())
        elif record.kind == "decision":
            state.decision(record.seq, record.payload())
        elif record.kind == "names":
            state.names(record.payload())
        elif record.kind == "batch":
            state.batch(record)
        else:  # genesis, context resets, dry-run batches: nothing was served or stored by them
            state.skipped[record.kind] = state.skipped.get(record.kind, 0) + 1
    unmatched = sorted(f"{ns}/{key}" for ns, key in set(flagged_keys) - state.matched_keys)
    unmatched += sorted(f"sha256:{v}" for v in set(flagged_values) - state.matched_values)
    if unmatched:
        raise MemoryMonitorError(
            f"flagged {', '.join(unmatched)} but the audit log has no accepted write of it; flag a namespace/key "
            "the monitor stored (or the sha256 of a value it accepted)"
        )
    return state.lines, tuple(state.seeds), dict(sorted(state.skipped.items()))


def export_audit_incident(
    audit: AuditLog | Sequence[AuditRecord],
    path: Path | str,
    *,
    flagged_keys: Collection[tuple[str, str]] = (),
    flagged_values: Collection[str] = (),
    contents: Mapping[str, str] | None = None,
    shared: str = "shared",
    expected_head: str | None = None,
) -> AuditExport:
    """Verify the chain (against the head this process wrote for a live ``AuditLog``, and ``expected_head``
    when the operator has one from elsewhere), write its incident log atomically and parse it back with the
    platform's validator."""
    from rvu_pipelines.provenance.incident import load_incident, write_incident

    if isinstance(audit, AuditLog):
        verification = audit.verify(expected_head)
        records = list(audit.records())
    else:
        records = list(audit)
        verification = verify_chain(records, expected_head=expected_head)
    if not verification.ok:
        raise MemoryMonitorError(
            f"the audit chain does not verify ({verification.problem}); an incident is exported only from an "
            "intact chain"
        )
    if not flagged_keys and not flagged_values:
        raise MemoryMonitorError("name at least one flagged write (namespace/key or value sha256): the recovery seeds")
    lines, seeds, skipped = audit_incident_records(
        records, flagged_keys=flagged_keys, flagged_values=flagged_values, contents=contents, shared=shared
    )
    written = write_incident(lines, path)
    load_incident(written)
    return AuditExport(Path(written), len(records), len(lines), seeds, skipped)
