"""The reference monitor of seed 002 §3.3-3.4: Rules 1-9 for single calls and numpy batches.

The runtime (not the model) calls it: ``channel`` is the channel the data really arrived on, a
``Channel`` value the runtime holds; whatever provenance the model claims goes in ``claimed`` and
is only logged. ``ReferenceMonitor`` is one object in three files: this one holds its state
(interned names, the columnar items M_t, the belief graph B_t), genesis, views and persistence;
``rules.py`` the single-call deciders with the decision tables and the paper-level rule choices;
``batch.py`` the numpy batch path, which must give the same codes.

Belief nodes enter B_t by OBSERVE (a labelled input: tainted iff its channel is untrusted), READ
(Rule 1: carries m.τ) or DERIVE (model output: taint is the max over its parents, Rule 8; with no
explicit parents, the whole session context, the conservative A3 policy).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from rvu_pipelines.bounded_io import truncate_for_message
from rvu_pipelines.errors import (
    GenesisClosedError,
    MemoryMonitorError,
    NamespaceError,
    ProvenanceError,
    UnknownBeliefError,
)
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.memory.audit import AuditLog, encode_belief, encode_context_reset
from rvu_pipelines.memory.batch import BatchPath
from rvu_pipelines.memory.model import BeliefNode, Channel, MemoryItem, NodeKind
from rvu_pipelines.memory.rules import KEY_BITS, SHARED_CODE, TRUSTED_BY_CHANNEL, SingleCallPath
from rvu_pipelines.memory.store import InMemoryStore, MemoryStore
from rvu_pipelines.memory.user_channel import ContentCheck, QueryAwareCheck, UserChannel
from rvu_pipelines.text_rules import text_problem


class ReferenceMonitor(SingleCallPath, BatchPath):
    """Decides every memory action against Rules 1-9 and commits only what they accept.

    One runtime thread drives it (wrap calls in a lock to share it). Construct with a ``store`` (M_0
    is loaded from it; ``DuckDBStore`` to persist, ``InMemoryStore`` by default), an ``audit`` log
    (a fresh in-memory ``AuditLog`` by default; ``False`` disables it, for benchmarks only) and
    optionally a ``UserChannel`` for the §9.5 mitigations and a ``write_check``: an enforced
    content check (e.g. MEMSAD, ``rvu_pipelines.memory_poisoning.monitor_check``) run on every write
    the rules would accept; a flagged write is rejected under Rule.WRITE_CHECK.
    """

    def __init__(
        self,
        store: MemoryStore | None = None,
        *,
        audit: AuditLog | None | bool = None,
        shared_namespace: str = "shared",
        user_channel: UserChannel | None = None,
        write_check: ContentCheck | None = None,
    ) -> None:
        if type(shared_namespace) is not str or not shared_namespace:
            raise NamespaceError("shared_namespace must be a non-empty string.")
        self.store: MemoryStore = store if store is not None else InMemoryStore()
        self.audit: AuditLog | None = (
            AuditLog() if audit is None or audit is True else None if audit is False else audit
        )
        self.user_channel = user_channel
        self.write_check = write_check
        self.shared = shared_namespace
        # interning
        self._ns_names: list[str] = [shared_namespace]
        self._ns_code: dict[str, int] = {shared_namespace: SHARED_CODE}
        self._key_names: list[str] = []
        self._key_code: dict[str, int] = {}
        self._key_immut = bytearray()
        self._immutable_keys: set[str] = set()
        self._names_logged = (0, 0)  # (#namespaces, #keys) already in the audit log
        # items: namespace -> key -> slot, plus columnar slot arrays
        self._index: dict[str, dict[str, int]] = {}
        self._slot_ns = array("q")
        self._slot_key = array("q")
        self._slot_next = array("q")  # next slot with the same key (-1 ends the chain)
        self._key_head = array("q")  # newest slot per key code (-1: none)
        self._slot_value: list[str] = []
        self._slot_channel = bytearray()
        self._slot_taint = bytearray()
        self._slot_immut = bytearray()
        self._dirty: set[int] = set()
        # belief graph B_t
        self._node_taint = bytearray()
        self._node_own = bytearray()
        self._node_kind = bytearray()
        self._node_ref = array("q")  # channel (OBSERVE), slot id ns<<32|key (READ), -1 (DERIVE)
        self._node_session = array("q")
        self._node_parents: dict[int, tuple[int, ...]] = {}
        self._context: dict[str, list[int]] = {}
        self._context_taint: dict[str, int] = {}
        self._sessions_ok: set[str] = set()
        self._started = False
        # numpy caches for the batch path
        self._reset_mirrors()
        loaded = self.store.load()
        if loaded:
            self._install(loaded, persist=False, source="store")

    # ------------------------------------------------------------------ genesis (S_0)

    def install(self, item: MemoryItem) -> None:
        self.install_many([item])

    def install_many(self, items: Iterable[MemoryItem]) -> None:
        """Place items into M_0 (SOUL.md, config, cached inputs); closed once the first action runs."""
        self._install(list(items), persist=True, source="install")

    def _install(self, items: list[MemoryItem], *, persist: bool, source: str) -> None:
        if self._started:
            raise GenesisClosedError(
                "Items can be installed only before the monitor's first decision (they form S_0). "
                "Write through the monitor instead, or start a new monitor over the store."
            )
        for item in items:
            if not isinstance(item, MemoryItem) or type(item.channel) is not Channel:
                raise ProvenanceError(f"install expects MemoryItem with a Channel label, got {item!r}.")
            self._check_name(item.namespace, "namespace")
            self._check_name(item.key, "key")
            if (problem := text_problem(item.value)) is not None:
                raise MemoryMonitorError(f"Item {item.namespace}/{item.key}: its value {problem}; nothing installed.")
        for item in items:
            slot = self._put(
                item.namespace, item.key, item.value, int(item.channel), int(item.tainted), int(item.immutable)
            )
            if item.immutable:
                self._immutable_keys.add(item.key)
                self._key_immut[self._key_code[item.key]] = 1
            if persist:
                self._dirty.add(slot)
        self._reset_mirrors()
        if self.audit is not None and items:
            immutable = sorted((i.namespace, i.key, sha256_bytes(i.value.encode())) for i in items if i.immutable)
            self.audit.append(
                "genesis",
                {
                    "source": source,
                    "n_items": len(items),
                    "state_sha256": self.state_digest(),
                    "immutable": [{"namespace": n, "key": k, "value_sha256": h} for n, k, h in immutable],
                },
            )

    # ------------------------------------------------------------------ interning and slots

    @staticmethod
    def _check_name(name: object, what: str) -> None:
        if type(name) is not str or not name:
            raise NamespaceError(f"A memory {what} must be a non-empty string, got {truncate_for_message(name)}.")
        if (problem := text_problem(name)) is not None:
            raise NamespaceError(f"A memory {what} must be valid text: {problem}. Nothing was recorded.")

    def _check_session(self, session: object) -> None:
        self._check_name(session, "session")
        if session == self.shared:
            raise NamespaceError(
                f"'{session}' is the shared namespace; actions run in a session namespace and reach "
                "the shared one through READ or PROMOTE."
            )
        self._sessions_ok.add(session)  # type: ignore[arg-type]

    def _intern_ns(self, name: str) -> int:
        code = self._ns_code.get(name)
        if code is None:
            self._check_name(name, "namespace")
            code = self._ns_code[name] = len(self._ns_names)
            self._ns_names.append(name)
        return code

    def _intern_key(self, name: str) -> int:
        code = self._key_code.get(name)
        if code is None:
            self._check_name(name, "key")
            code = self._key_code[name] = len(self._key_names)
            self._key_names.append(name)
            self._key_immut.append(0)
            self._key_head.append(-1)
        return code

    def _put(self, ns: str, key: str, value: str, channel: int, taint: int, immut: int) -> int:
        keys = self._index.get(ns)
        if keys is None:
            self._intern_ns(ns)
            keys = self._index[ns] = {}
        slot = keys.get(key)
        if slot is None:
            slot = keys[key] = len(self._slot_value)
            kc = self._intern_key(key)
            self._slot_ns.append(self._ns_code[ns])
            self._slot_key.append(kc)
            self._slot_next.append(self._key_head[kc])
            self._key_head[kc] = slot
            self._slot_value.append(value)
            self._slot_channel.append(channel)
            self._slot_taint.append(taint)
            self._slot_immut.append(immut)
        else:
            self._taint_dirty.append(slot)
            self._slot_value[slot] = value
            self._slot_channel[slot] = channel
            self._slot_taint[slot] = taint
            self._slot_immut[slot] = immut
        return slot

    def _commit_write(self, ns: str, key: str, value: str, channel: int) -> None:
        # Rule 2: M[k -> (k, v, π, 0, ι(k), σ)]; ι(k) is 0 here, or Rule 3 would have fired.
        self._dirty.add(self._put(ns, key, value, channel, 0, 0))

    def _commit_promote(self, src: str, key: str) -> None:
        # Rule 6: M ∪ {m[σ := σ_shared]}: the item, its label, τ(m) = 0 and ι, copied.
        slot = self._index[src][key]
        self._dirty.add(
            self._put(
                self.shared,
                key,
                self._slot_value[slot],
                self._slot_channel[slot],
                self._slot_taint[slot],
                self._slot_immut[slot],
            )
        )

    # ------------------------------------------------------------------ belief graph (INTERNAL)

    def _add_node(self, kind: int, session: str, ref: int, own: int, taint: int) -> int:
        node = len(self._node_taint)
        self._node_taint.append(taint)
        self._node_own.append(own)
        self._node_kind.append(kind)
        self._node_ref.append(ref)
        self._node_session.append(self._intern_ns(session))
        ctx = self._context.get(session)
        if ctx is None:
            ctx = self._context[session] = []
            self._context_taint[session] = 0
        ctx.append(node)
        if taint:
            self._context_taint[session] = 1
        return node

    def observe(self, session: str, channel: Channel, content: str = "") -> int:
        """Label an input entering the session's context (§3.4 source labeling); returns its node.

        Untrusted channels (WEB, TOOL, SKILL) produce tainted nodes; USER and SYSTEM do not. A USER input is a
        query the agent serves: a write check that scores against served queries (``QueryAwareCheck``) gets it.
        """
        if session not in self._sessions_ok:
            self._check_session(session)
        if type(channel) is not Channel:
            raise self._provenance_error(channel)
        own = 0 if TRUSTED_BY_CHANNEL[channel] else 1
        node = self._add_node(NodeKind.OBSERVE, session, int(channel), own, own)
        self._started = True
        if channel is Channel.USER and content and isinstance(self.write_check, QueryAwareCheck):
            self.write_check.observe_query(content)
        if self.audit is not None:
            self.audit.record((encode_belief, node, NodeKind.OBSERVE, session, int(channel), content, (), own))
        return node

    def derive(self, session: str, parents: Sequence[int] | None = None) -> int:
        """A node for model output (INTERNAL); Rule 8: its taint is the max over its ancestors.

        With ``parents=None`` the parents are the whole session context (A3's conservative policy).
        """
        if session not in self._sessions_ok:
            self._check_session(session)
        if parents is None:
            parents_t = tuple(self._context.get(session, ()))
            taint = self._context_taint.get(session, 0)
        else:
            parents_t = tuple(parents)
            taint, _ = self._deps_taint(parents_t)
        node = self._add_node(NodeKind.DERIVE, session, -1, 0, taint)
        self._node_parents[node] = parents_t
        self._started = True
        if self.audit is not None:
            self.audit.record((encode_belief, node, NodeKind.DERIVE, session, None, None, parents_t, taint))
        return node

    def reset_context(self, session: str) -> None:
        """Start a fresh context window for the session (the nodes stay in B_t)."""
        if session not in self._sessions_ok:
            self._check_session(session)
        self._context[session] = []
        self._context_taint[session] = 0
        if self.audit is not None:
            self.audit.record((encode_context_reset, session))

    def context(self, session: str) -> tuple[int, ...]:
        return tuple(self._context.get(session, ()))

    def node(self, node: int) -> BeliefNode:
        if not 0 <= node < len(self._node_taint):
            raise UnknownBeliefError(f"Belief node {node} does not exist (B has {len(self._node_taint)} nodes).")
        kind = NodeKind(self._node_kind[node])
        ref = self._node_ref[node]
        source = None
        if kind is NodeKind.READ:
            source = (self._ns_names[ref >> KEY_BITS], self._key_names[ref & 0xFFFFFFFF])
        return BeliefNode(
            id=node,
            kind=kind,
            session=self._ns_names[self._node_session[node]],
            tainted=bool(self._node_taint[node]),
            own_taint=bool(self._node_own[node]),
            parents=self._node_parents.get(node, ()),
            channel=Channel(ref) if kind is NodeKind.OBSERVE else None,
            source=source,
        )

    @property
    def namespace_names(self) -> Sequence[str]:
        """Interned namespace names by code (code 0 is the shared namespace)."""
        return tuple(self._ns_names)

    @property
    def key_names(self) -> Sequence[str]:
        """Interned key names by code."""
        return tuple(self._key_names)

    @property
    def n_nodes(self) -> int:
        return len(self._node_taint)

    def _deps_taint(self, deps: Iterable[int]) -> tuple[int, int]:
        """(any dep tainted, any tainted dep whose taint is inherited), validating the ids."""
        nt, no = self._node_taint, self._node_own
        n = len(nt)
        taint = inherited = 0
        try:
            for d in deps:
                if not 0 <= d < n:
                    raise UnknownBeliefError(f"Dependency {d!r} is not a belief node (B has {n} nodes).")
                if nt[d]:
                    taint = 1
                    if not no[d]:
                        inherited = 1
        except TypeError as exc:
            raise UnknownBeliefError(f"Dependencies must be belief node ids (ints): {exc}") from None
        return taint, inherited

    @staticmethod
    def _provenance_error(channel: object) -> ProvenanceError:
        return ProvenanceError(
            f"Provenance must be the Channel the runtime observed, got {type(channel).__name__} {channel!r}. "
            "Labels are never taken from model output (§3.4); pass the model's claim as `claimed`."
        )

    # ------------------------------------------------------------------ views (Rule 9) and state

    def visible(self, session: str) -> list[MemoryItem]:
        """visible(σ_s) = items of σ_s ∪ items of σ_shared (Rule 9), sorted by (namespace, key)."""
        if session not in self._sessions_ok:
            self._check_session(session)
        out: list[MemoryItem] = []
        for ns in sorted({session, self.shared}):
            keys = self._index.get(ns, {})
            out.extend(self._item(ns, k, keys[k]) for k in sorted(keys))
        return out

    def _item(self, ns: str, key: str, slot: int) -> MemoryItem:
        return MemoryItem(
            ns,
            key,
            self._slot_value[slot],
            Channel(self._slot_channel[slot]),
            bool(self._slot_taint[slot]),
            bool(self._slot_immut[slot]),
        )

    def get(self, namespace: str, key: str) -> MemoryItem | None:
        """Administrative view of one item (no decision, no belief node): for operators and tests."""
        slot = self._index.get(namespace, {}).get(key)
        return None if slot is None else self._item(namespace, key, slot)

    def items(self) -> list[MemoryItem]:
        """All of M_t, sorted by (namespace, key)."""
        return [
            self._item(ns, k, keys[k])
            for ns in sorted(self._index)
            for keys in (self._index[ns],)
            for k in sorted(keys)
        ]

    def __len__(self) -> int:
        return len(self._slot_value)

    def snapshot(self) -> dict[tuple[str, str], tuple[str, int, int, int]]:
        """M_t as {(namespace, key): (value, channel, tainted, immutable)}: cheap to diff."""
        v, c, t, i = self._slot_value, self._slot_channel, self._slot_taint, self._slot_immut
        return {(ns, k): (v[s], c[s], t[s], i[s]) for ns, keys in self._index.items() for k, s in keys.items()}

    def is_immutable(self, key: str) -> bool:
        return key in self._immutable_keys

    def namespaces(self) -> list[str]:
        return sorted(self._index)

    def state_digest(self) -> str:
        """sha256 over the sorted items (length-prefixed fields): one value that pins M_t."""
        v, c, t, i = self._slot_value, self._slot_channel, self._slot_taint, self._slot_immut
        parts = []
        for ns in sorted(self._index):
            keys = self._index[ns]
            nb = ns.encode()
            prefix = b"%d:%s" % (len(nb), nb)
            for k in sorted(keys):
                s, kb = keys[k], k.encode()
                vb = v[s].encode()
                parts.append(b"%s%d:%s%d:%s%d%d%d;" % (prefix, len(kb), kb, len(vb), vb, c[s], t[s], i[s]))
        return sha256_bytes(b"".join(parts))

    def flush(self) -> None:
        """Persist changed items to the store and the sealed audit records to its sink.

        The audit records are flushed even when the store refuses the items (the items stay dirty, to be
        written by the next flush), so a failing store never costs the record of what was decided."""
        try:
            if self._dirty:
                slots = sorted(self._dirty)
                ns_names, key_names = self._ns_names, self._key_names
                items = [self._item(ns_names[self._slot_ns[s]], key_names[self._slot_key[s]], s) for s in slots]
                self.store.upsert(sorted(items, key=lambda i: (i.namespace, i.key)))
                self._dirty.clear()
        finally:
            if self.audit is not None:
                self.audit.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            try:
                if self.audit is not None:
                    self.audit.close()
            finally:
                self.store.close()

    def __enter__(self) -> ReferenceMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
