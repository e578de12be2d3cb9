"""The reference monitor of seed 002 §3.3-3.4: Rules 1-9 for single calls and numpy batches.

The runtime (not the model) calls it: ``channel`` is the channel the data really arrived on, a
``Channel`` value the runtime holds; whatever provenance the model claims goes in ``claimed`` and
is only logged. Every call returns a ``Decision`` naming the rule that decided and every rule whose
premise held. Seed-level choices (documented once here):

* Rule precedence when several rejections apply: WRITE 3 > 4 > 5 > 9; PROMOTE 9 > 7 > 3. All rules
  whose premises hold are in ``Decision.rules``; Rule 8 joins Rule 4 when a tainted dependency got
  its taint from an ancestor rather than its own source.
* ι is per key (ι(k) in Rules 2-3): a key that is immutable in any namespace is immutable in all,
  so an attacker cannot shadow SOUL.md with a session-local copy.
* Rule 9 scopes every memory action to ``visible(σ_session)``: READ may address the session's own
  namespace or the shared one; WRITE only the session's own namespace; PROMOTE only from it. The
  shared namespace is reached only through PROMOTE (Rule 6), so §9.5's promotion rate limit can't
  be sidestepped with a direct write.
* PROMOTE of a missing item is rejected under Rule 7 (reason NOT_FOUND): fail closed.
* A promoted item keeps its provenance label (Rule 6 copies m); promotion of an immutable key is
  rejected by Rule 3, since it would write a new value under that key in the shared namespace.

Belief nodes enter B_t by OBSERVE (a labelled input: tainted iff its channel is untrusted), READ
(Rule 1: carries m.τ) or DERIVE (model output: taint is the max over its parents, Rule 8; with no
explicit parents, the whole session context, the conservative A3 policy).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring as _json_str  # C-accelerated JSON string quoting
from operator import itemgetter
from typing import Any

import numpy as np

from rvu_pipelines.errors import (
    GenesisClosedError,
    MemoryMonitorError,
    NamespaceError,
    ProvenanceError,
    UnknownBeliefError,
    UserChannelError,
)
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.memory.audit import AuditLog, canonical_json
from rvu_pipelines.memory.model import (
    DECISIONS,
    TRUST_BY_CHANNEL,
    TRUSTED_LUT,
    Action,
    BatchActions,
    BatchDecisions,
    BeliefNode,
    Channel,
    Decision,
    Internal,
    MemoryItem,
    NodeKind,
    Op,
    Promote,
    Read,
    ReadResult,
    Reason,
    Rule,
    Trust,
    Write,
    pack_decision,
)
from rvu_pipelines.memory.store import InMemoryStore, MemoryStore
from rvu_pipelines.memory.user_channel import UserChannel

SHARED_CODE = 0
_B0, _B1, _B2, _B3, _B4, _B5, _B6, _B7, _B8, _B9, _B10 = (1 << r for r in range(11))
_WRITE_REJECT_BITS = _B3 | _B4 | _B5 | _B9
_KEY_BITS = 32

# ---------------------------------------------------------------- precomputed decision codes


def _write_code(mask: int) -> int:
    if not mask & _WRITE_REJECT_BITS:
        return pack_decision(Op.WRITE, True, Rule.R2_WRITE, Reason.ACCEPTED, _B2)
    for bit, rule, reason in ((_B3, Rule.R3_IMMUTABLE, Reason.IMMUTABLE), (_B4, Rule.R4_TAINTED, Reason.TAINTED_DEPS),
                              (_B5, Rule.R5_UNTRUSTED, Reason.UNTRUSTED_PRINCIPAL),
                              (_B9, Rule.R9_NAMESPACE, Reason.NOT_VISIBLE)):
        if mask & bit:
            return pack_decision(Op.WRITE, False, rule, reason, mask)
    raise AssertionError(mask)


_WRITE_CODES: dict[int, int] = {
    m: _write_code(m)
    for m in range(1 << 11)
    if not m & ~(_B3 | _B4 | _B5 | _B8 | _B9) and (not m & _B8 or m & _B4)
}
WRITE_OK = _WRITE_CODES[0]


def _promote_code(not_visible: bool, immutable: bool, r7: Reason | None) -> int:
    if not_visible:
        return pack_decision(Op.PROMOTE, False, Rule.R9_NAMESPACE, Reason.NOT_VISIBLE, _B9)
    mask = (_B3 if immutable else 0) | (_B7 if r7 is not None else 0)
    if r7 is not None:
        return pack_decision(Op.PROMOTE, False, Rule.R7_PROMOTE_REJECTED, r7, mask)
    if immutable:
        return pack_decision(Op.PROMOTE, False, Rule.R3_IMMUTABLE, Reason.IMMUTABLE, mask)
    return pack_decision(Op.PROMOTE, True, Rule.R6_PROMOTE, Reason.ACCEPTED, _B6)


_R7_REASONS = (None, Reason.UNTRUSTED_AUTHORIZER, Reason.NOT_FOUND, Reason.TAINTED_ITEM)
_PROMOTE_CODES: dict[tuple[bool, Reason | None], int] = {
    (imm, r7): _promote_code(False, imm, r7) for imm in (False, True) for r7 in _R7_REASONS
}
PROMOTE_OK = _PROMOTE_CODES[(False, None)]
PROMOTE_NOT_VISIBLE = _promote_code(True, False, None)
READ_OK = pack_decision(Op.READ, True, Rule.R1_READ, Reason.ACCEPTED, _B1)
READ_NOT_FOUND = pack_decision(Op.READ, False, Rule.R1_READ, Reason.NOT_FOUND, _B1)
READ_NOT_VISIBLE = pack_decision(Op.READ, False, Rule.R9_NAMESPACE, Reason.NOT_VISIBLE, _B9)
INTERNAL_OK = pack_decision(Op.INTERNAL, True, Rule.NOT_INTERPOSED, Reason.NOT_INTERPOSED, _B0)
WRITE_RATE_LIMITED = pack_decision(Op.WRITE, False, Rule.USER_CHANNEL_POLICY, Reason.RATE_LIMITED, _B10)
WRITE_DECLINED = pack_decision(Op.WRITE, False, Rule.USER_CHANNEL_POLICY, Reason.USER_DECLINED, _B10)
PROMOTE_RATE_LIMITED = pack_decision(Op.PROMOTE, False, Rule.USER_CHANNEL_POLICY, Reason.RATE_LIMITED, _B10)
PROMOTE_DECLINED = pack_decision(Op.PROMOTE, False, Rule.USER_CHANNEL_POLICY, Reason.USER_DECLINED, _B10)


def _batch_codes() -> np.ndarray:
    """Decision code by (op << 5 | premise bits): built from the single-call tables above."""
    lut = np.zeros(128, np.uint32)
    for idx in range(32):
        b3, b4, b8, b5, b9 = (idx >> i & 1 for i in range(5))
        mask = b3 * _B3 | b4 * _B4 | b8 * _B8 | b5 * _B5 | b9 * _B9
        if mask in _WRITE_CODES:
            lut[Op.WRITE << 5 | idx] = _WRITE_CODES[mask]
    for idx in range(16):
        p9, p3, r7 = idx & 1, idx >> 1 & 1, idx >> 2
        lut[Op.PROMOTE << 5 | idx] = PROMOTE_NOT_VISIBLE if p9 else _PROMOTE_CODES[(bool(p3), _R7_REASONS[r7])]
    lut[Op.READ << 5 | 0] = READ_NOT_FOUND
    lut[Op.READ << 5 | 1] = READ_NOT_VISIBLE
    lut[Op.READ << 5 | 2] = READ_OK
    lut[Op.INTERNAL << 5] = INTERNAL_OK
    return lut


_BATCH_CODES = _batch_codes()
_TRUSTED = tuple(t is Trust.TRUSTED for t in TRUST_BY_CHANNEL)
_USER = Channel.USER
_OP_NAMES = tuple(op.name for op in Op)

# ---------------------------------------------------------------- audit encoders (run at seal time)


def _value_digest(value: str | None) -> str | None:
    return None if value is None else sha256_bytes(value.encode())


def _q(text: str | None) -> str:
    return "null" if text is None else _json_str(text)


def _encode_decision(e: tuple[Any, ...]) -> tuple[str, bytes]:
    """A decision as a positional JSON array (see audit.DECISION_FIELDS): cheap to build and hash."""
    _, _op, code, session, ns, key, channel, claimed, deps, value, node, extra = e
    return "decision", ("[%d,%s,%s,%s,%s,%s,[%s],%s,%s,%s]" % (
        code, _json_str(session), _q(ns), _q(key), "null" if channel is None else channel, _q(claimed),
        ",".join(map(str, deps)), "null" if value is None else '"%s"' % sha256_bytes(value.encode()),
        "null" if node is None else node, "null" if extra is None else canonical_json(extra).decode(),
    )).encode()


def _encode_belief(e: tuple[Any, ...]) -> tuple[str, bytes]:
    _, node, kind, session, channel, content, parents, tainted = e
    return "belief", canonical_json({
        "node": node, "kind": NodeKind(kind).name, "session": session,
        "channel": None if channel is None else Channel(channel).name,
        "content_sha256": _value_digest(content), "parents": list(parents), "tainted": bool(tainted),
    })


def _encode_context_reset(e: tuple[Any, ...]) -> tuple[str, bytes]:
    return "context_reset", canonical_json({"session": e[1]})


# ---------------------------------------------------------------- helpers for the batch path


class _Tail:
    """Numpy mirror of an append-only array('q')/bytearray that copies only the new tail."""

    def __init__(self, dtype: type) -> None:
        self.buf = np.zeros(1024, dtype)
        self.n = 0

    def sync(self, src: array | bytearray) -> np.ndarray:
        m = len(src)
        if m > self.n:
            if m > self.buf.shape[0]:
                grown = np.zeros(max(m, 2 * self.buf.shape[0]), self.buf.dtype)
                grown[: self.n] = self.buf[: self.n]
                self.buf = grown
            self.buf[self.n:m] = np.frombuffer(src[self.n:m], self.buf.dtype)
            self.n = m
        return self.buf[:m]


def _hit_before(n_slots: int, virtual: np.ndarray, m_rows: np.ndarray, m_found: np.ndarray, m_slot: np.ndarray,
                m_sid: np.ndarray, q_rows: np.ndarray, q_found: np.ndarray, q_slot: np.ndarray, q_sid: np.ndarray,
                n: int) -> np.ndarray:
    """For each query row: did a mutation row hit the same item at an earlier position?

    Large batches index a dense array by slot (new items: n_slots + rank in ``virtual``, the sorted
    sids of not-yet-existing items); small batches against a large store sort the few mutated sids
    instead, so a batch never costs O(store).
    """
    if m_rows.size == 0 or q_rows.size == 0:
        return np.zeros(q_rows.size, np.bool_)
    if n_slots + virtual.size > 8 * n:
        uniq, inverse = np.unique(m_sid, return_inverse=True)
        first = np.full(uniq.size, n, np.int64)
        np.minimum.at(first, inverse, m_rows)
        at = np.minimum(np.searchsorted(uniq, q_sid), uniq.size - 1)
        return (uniq[at] == q_sid) & (first[at] < q_rows)
    m_id = m_slot.copy()
    if virtual.size:
        m_id[~m_found] = n_slots + np.searchsorted(virtual, m_sid[~m_found])
    first = np.full(n_slots + virtual.size, n, np.int64)
    np.minimum.at(first, m_id, m_rows)
    q_id = q_slot.copy()
    miss = np.flatnonzero(~q_found)
    if virtual.size and miss.size:
        at = np.minimum(np.searchsorted(virtual, q_sid[miss]), virtual.size - 1)
        hit = virtual[at] == q_sid[miss]
        q_id[miss[hit]] = n_slots + at[hit]
    ok = q_id >= 0
    out = np.zeros(q_rows.size, np.bool_)
    out[ok] = first[q_id[ok]] < q_rows[ok]
    return out


def _segment_any(flags: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    csum = np.empty(flags.shape[0] + 1, dtype=np.int64)
    csum[0] = 0
    np.cumsum(flags, dtype=np.int64, out=csum[1:])
    return (csum[ptr[1:]] - csum[ptr[:-1]]) > 0


class ReferenceMonitor:
    """Decides every memory action against Rules 1-9 and commits only what they accept.

    One runtime thread drives it (wrap calls in a lock to share it). Construct with a ``store`` (M_0 is loaded from it; ``DuckDBStore`` to persist, ``InMemoryStore``
    by default), an ``audit`` log (a fresh in-memory ``AuditLog`` by default; ``False`` disables it,
    for benchmarks only) and optionally a ``UserChannel`` for the §9.5 mitigations.
    """

    def __init__(self, store: MemoryStore | None = None, *, audit: AuditLog | None | bool = None,
                 shared_namespace: str = "shared", user_channel: UserChannel | None = None) -> None:
        if type(shared_namespace) is not str or not shared_namespace:
            raise NamespaceError("shared_namespace must be a non-empty string.")
        self.store: MemoryStore = store if store is not None else InMemoryStore()
        self.audit: AuditLog | None = (
            AuditLog() if audit is None or audit is True else None if audit is False else audit
        )
        self.user_channel = user_channel
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
            if type(item.value) is not str:
                raise MemoryMonitorError(f"Item {item.namespace}/{item.key}: value must be str.")
        for item in items:
            slot = self._put(item.namespace, item.key, item.value, int(item.channel), int(item.tainted),
                             int(item.immutable))
            if item.immutable:
                self._immutable_keys.add(item.key)
                self._key_immut[self._key_code[item.key]] = 1
            if persist:
                self._dirty.add(slot)
        self._reset_mirrors()
        if self.audit is not None and items:
            immutable = sorted(
                (i.namespace, i.key, sha256_bytes(i.value.encode())) for i in items if i.immutable
            )
            self.audit.append("genesis", {
                "source": source, "n_items": len(items), "state_sha256": self.state_digest(),
                "immutable": [{"namespace": n, "key": k, "value_sha256": h} for n, k, h in immutable],
            })

    # ------------------------------------------------------------------ interning and slots

    @staticmethod
    def _check_name(name: object, what: str) -> None:
        if type(name) is not str or not name:
            raise NamespaceError(f"A memory {what} must be a non-empty string, got {name!r}.")

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
        self._dirty.add(self._put(self.shared, key, self._slot_value[slot], self._slot_channel[slot],
                                  self._slot_taint[slot], self._slot_immut[slot]))

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

        Untrusted channels (WEB, TOOL, SKILL) produce tainted nodes; USER and SYSTEM do not.
        """
        if session not in self._sessions_ok:
            self._check_session(session)
        if type(channel) is not Channel:
            raise self._provenance_error(channel)
        own = 0 if _TRUSTED[channel] else 1
        node = self._add_node(NodeKind.OBSERVE, session, int(channel), own, own)
        self._started = True
        if self.audit is not None:
            self.audit.record((_encode_belief, node, NodeKind.OBSERVE, session, int(channel), content, (), own))
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
            self.audit.record((_encode_belief, node, NodeKind.DERIVE, session, None, None, parents_t, taint))
        return node

    def reset_context(self, session: str) -> None:
        """Start a fresh context window for the session (the nodes stay in B_t)."""
        if session not in self._sessions_ok:
            self._check_session(session)
        self._context[session] = []
        self._context_taint[session] = 0
        if self.audit is not None:
            self.audit.record((_encode_context_reset, session))

    def context(self, session: str) -> tuple[int, ...]:
        return tuple(self._context.get(session, ()))

    def node(self, node: int) -> BeliefNode:
        if not 0 <= node < len(self._node_taint):
            raise UnknownBeliefError(f"Belief node {node} does not exist (B has {len(self._node_taint)} nodes).")
        kind = NodeKind(self._node_kind[node])
        ref = self._node_ref[node]
        source = None
        if kind is NodeKind.READ:
            source = (self._ns_names[ref >> _KEY_BITS], self._key_names[ref & 0xFFFFFFFF])
        return BeliefNode(
            id=node, kind=kind, session=self._ns_names[self._node_session[node]],
            tainted=bool(self._node_taint[node]), own_taint=bool(self._node_own[node]),
            parents=self._node_parents.get(node, ()),
            channel=Channel(ref) if kind is NodeKind.OBSERVE else None, source=source,
        )

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

    # ------------------------------------------------------------------ the rules, single call

    def write(self, session: str, key: str, value: str, *, channel: Channel, deps: Sequence[int] = (),
              namespace: str | None = None, claimed: str | None = None) -> Decision:
        """WRITE(k, v, deps, π, σ): Rules 2-5 and 9; π is the trust of ``channel``."""
        if session not in self._sessions_ok:
            self._check_session(session)
        if type(channel) is not Channel:
            raise self._provenance_error(channel)
        ns = session
        if namespace is not None:
            self._check_name(namespace, "namespace")
            ns = namespace
        if type(key) is not str or not key or type(value) is not str:
            raise MemoryMonitorError(f"WRITE needs a non-empty str key and a str value, got {key!r}, {type(value).__name__}.")
        mask = _B3 if key in self._immutable_keys else 0
        if deps:
            taint, inherited = self._deps_taint(deps)
            if taint:
                mask |= _B4 | _B8 if inherited else _B4
        if not _TRUSTED[channel]:
            mask |= _B5
        if ns != session:
            mask |= _B9
        extra = None
        if channel is _USER and self.user_channel is not None:
            code, extra = self._user_write(session, ns, key, value, mask)
        elif mask:
            code = _WRITE_CODES[mask]
        else:
            self._commit_write(ns, key, value, channel)
            code = WRITE_OK
        self._started = True
        if self.audit is not None:
            self.audit.record((_encode_decision, Op.WRITE, code, session, ns, key, int(channel), claimed,
                               tuple(deps), value, None, extra))
        return DECISIONS[code]

    def _user_write(self, session: str, ns: str, key: str, value: str, mask: int) -> tuple[int, dict[str, Any]]:
        uc = self.user_channel
        assert uc is not None
        old = None
        if ns == session or ns == self.shared:  # never put another session's content in the diff
            slot = self._index.get(ns, {}).get(key)
            old = None if slot is None else self._slot_value[slot]
        review = uc.review(session, ns, key, old, value, "WRITE")
        if mask:
            code = _WRITE_CODES[mask]
        elif not uc.write_allowed():
            code = WRITE_RATE_LIMITED
        elif not uc.approve(review):
            code = WRITE_DECLINED
        else:
            self._commit_write(ns, key, value, _USER)
            uc.note_write()
            code = WRITE_OK
        return code, review.audit_view()

    def read(self, session: str, key: str, namespace: str | None = None) -> ReadResult:
        """READ(k, σ): Rule 9 scopes σ to visible(session); Rule 1 adds a node carrying m.τ."""
        if session not in self._sessions_ok:
            self._check_session(session)
        ns = session if namespace is None else namespace
        value = node = None
        if ns != session and ns != self.shared:
            code = READ_NOT_VISIBLE
        else:
            keys = self._index.get(ns)
            slot = None if keys is None else keys.get(key)
            if slot is None:
                code = READ_NOT_FOUND
            else:
                taint = self._slot_taint[slot]
                ref = self._slot_ns[slot] << _KEY_BITS | self._slot_key[slot]
                node = self._add_node(NodeKind.READ, session, ref, taint, taint)
                value = self._slot_value[slot]
                code = READ_OK
        self._started = True
        if self.audit is not None:
            self.audit.record((_encode_decision, Op.READ, code, session, ns, key, None, None, (), None, node, None))
        return ReadResult(DECISIONS[code], value, node)

    def promote(self, session: str, key: str, *, authorizer: Channel, source: str | None = None) -> Decision:
        """PROMOTE(k, σ_src, σ_shared): Rule 6 if the authorizer is trusted and τ(m) = 0, else Rule 7."""
        if session not in self._sessions_ok:
            self._check_session(session)
        if type(authorizer) is not Channel:
            raise self._provenance_error(authorizer)
        src = session if source is None else source
        extra = None
        if src != session:
            code = PROMOTE_NOT_VISIBLE
        else:
            keys = self._index.get(src)
            slot = None if keys is None else keys.get(key)
            if not _TRUSTED[authorizer]:
                r7: Reason | None = Reason.UNTRUSTED_AUTHORIZER
            elif slot is None:
                r7 = Reason.NOT_FOUND
            elif self._slot_taint[slot]:
                r7 = Reason.TAINTED_ITEM
            else:
                r7 = None
            code = _PROMOTE_CODES[(key in self._immutable_keys, r7)]
            if authorizer is _USER and self.user_channel is not None and slot is not None:
                code, extra = self._user_promote(session, key, slot, code)
            elif code == PROMOTE_OK:
                self._commit_promote(src, key)
        self._started = True
        if self.audit is not None:
            self.audit.record((_encode_decision, Op.PROMOTE, code, session, src, key, int(authorizer), None, (),
                               None, None, extra))
        return DECISIONS[code]

    def _user_promote(self, session: str, key: str, slot: int, code: int) -> tuple[int, dict[str, Any]]:
        uc = self.user_channel
        assert uc is not None
        shared_slot = self._index.get(self.shared, {}).get(key)
        old = None if shared_slot is None else self._slot_value[shared_slot]
        review = uc.review(session, self.shared, key, old, self._slot_value[slot], "PROMOTE")
        if code == PROMOTE_OK:
            if not uc.promotion_allowed():
                code = PROMOTE_RATE_LIMITED
            elif not uc.approve(review):
                code = PROMOTE_DECLINED
            else:
                self._commit_promote(session, key)
                uc.note_promotion()
        return code, review.audit_view()

    def internal(self, session: str, note: str = "") -> Decision:
        """INTERNAL(...): not interposed (§3.3); logged so the audit trail has no holes."""
        if session not in self._sessions_ok:
            self._check_session(session)
        self._started = True
        if self.audit is not None:
            self.audit.record((_encode_decision, Op.INTERNAL, INTERNAL_OK, session, None, None, None, note or None,
                               (), None, None, None))
        return DECISIONS[INTERNAL_OK]

    def submit(self, action: Action) -> Decision:
        """Decide one action of any kind (READ's value: use ``read``)."""
        kind = type(action)
        if kind is Write:
            a: Any = action
            return self.write(a.session, a.key, a.value, channel=a.channel, deps=a.deps, namespace=a.namespace,
                              claimed=a.claimed)
        if kind is Read:
            return self.read(action.session, action.key, action.namespace).decision  # type: ignore[union-attr]
        if kind is Promote:
            a = action
            return self.promote(a.session, a.key, authorizer=a.authorizer, source=a.source)
        if kind is Internal:
            return self.internal(action.session, action.note)  # type: ignore[union-attr]
        raise MemoryMonitorError(f"Not a memory action: {action!r}")

    # ------------------------------------------------------------------ views (Rule 9) and state

    def visible(self, session: str) -> list[MemoryItem]:
        """visible(σ_s) = items of σ_s ∪ items of σ_shared (Rule 9), sorted by (namespace, key)."""
        if session not in self._sessions_ok:
            self._check_session(session)
        out = []
        for ns in sorted({session, self.shared}):
            keys = self._index.get(ns, {})
            out.extend(self._item(ns, k, keys[k]) for k in sorted(keys))
        return out

    def _item(self, ns: str, key: str, slot: int) -> MemoryItem:
        return MemoryItem(ns, key, self._slot_value[slot], Channel(self._slot_channel[slot]),
                          bool(self._slot_taint[slot]), bool(self._slot_immut[slot]))

    def get(self, namespace: str, key: str) -> MemoryItem | None:
        """Administrative view of one item (no decision, no belief node): for operators and tests."""
        slot = self._index.get(namespace, {}).get(key)
        return None if slot is None else self._item(namespace, key, slot)

    def items(self) -> list[MemoryItem]:
        """All of M_t, sorted by (namespace, key)."""
        return [self._item(ns, k, keys[k]) for ns in sorted(self._index) for keys in (self._index[ns],)
                for k in sorted(keys)]

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
        """Persist changed items to the store and the sealed audit records to its sink."""
        if self._dirty:
            slots = sorted(self._dirty)
            ns_names, key_names = self._ns_names, self._key_names
            items = [self._item(ns_names[self._slot_ns[s]], key_names[self._slot_key[s]], s) for s in slots]
            self.store.upsert(sorted(items, key=lambda i: (i.namespace, i.key)))
            self._dirty.clear()
        if self.audit is not None:
            self.audit.flush()

    def close(self) -> None:
        self.flush()
        if self.audit is not None:
            self.audit.close()
        self.store.close()

    def __enter__(self) -> ReferenceMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ batches

    def intern_namespaces(self, names: Sequence[str]) -> np.ndarray:
        return np.fromiter((self._intern_ns(n) for n in names), dtype=np.int32, count=len(names))

    def intern_keys(self, names: Sequence[str]) -> np.ndarray:
        return np.fromiter((self._intern_key(n) for n in names), dtype=np.int32, count=len(names))

    def encode(self, actions: Sequence[Action]) -> BatchActions:
        """Turn actions into code arrays (validated as the single-call API would)."""
        n = len(actions)
        op = np.empty(n, np.uint8)
        ses = np.empty(n, np.int32)
        nsa = np.empty(n, np.int32)
        keya = np.zeros(n, np.int32)
        cha = np.zeros(n, np.uint8)
        ptr = np.zeros(n + 1, np.int64)
        deps: list[int] = []
        values: list[str | None] = [None] * n
        claimed: list[str | None] = [None] * n
        for i, a in enumerate(actions):
            kind = type(a)
            if kind not in (Read, Write, Promote, Internal):
                raise MemoryMonitorError(f"Not a memory action: {a!r}")
            if a.session not in self._sessions_ok:
                self._check_session(a.session)
            ses[i] = self._intern_ns(a.session)
            if kind is Write:
                if type(a.channel) is not Channel:
                    raise self._provenance_error(a.channel)
                if type(a.value) is not str:
                    raise MemoryMonitorError(f"WRITE value must be str, got {type(a.value).__name__}.")
                op[i], cha[i], values[i], claimed[i] = Op.WRITE, a.channel, a.value, a.claimed
                nsa[i] = self._intern_ns(a.session if a.namespace is None else a.namespace)
                keya[i] = self._intern_key(a.key)
                deps.extend(a.deps)
            elif kind is Read:
                op[i] = Op.READ
                nsa[i] = self._intern_ns(a.session if a.namespace is None else a.namespace)
                keya[i] = self._intern_key(a.key)
            elif kind is Promote:
                if type(a.authorizer) is not Channel:
                    raise self._provenance_error(a.authorizer)
                op[i], cha[i] = Op.PROMOTE, a.authorizer
                nsa[i] = self._intern_ns(a.session if a.source is None else a.source)
                keya[i] = self._intern_key(a.key)
            else:
                op[i] = Op.INTERNAL
                nsa[i] = ses[i]
                claimed[i] = a.note or None
            ptr[i + 1] = len(deps)
        return BatchActions(op, ses, nsa, keya, cha, ptr, np.asarray(deps, dtype=np.int64), values, claimed)

    def _validate_batch(self, b: BatchActions) -> None:
        n = len(b)
        for name in ("session", "namespace", "key", "channel"):
            if getattr(b, name).shape != (n,):
                raise MemoryMonitorError(f"Batch column '{name}' has shape {getattr(b, name).shape}, expected ({n},).")
        if b.dep_ptr.shape != (n + 1,) or (n and (b.dep_ptr[0] != 0 or b.dep_ptr[-1] != b.dep_idx.shape[0]
                                                  or np.any(np.diff(b.dep_ptr) < 0))):
            raise MemoryMonitorError("Batch dep_ptr must be CSR offsets: n+1 non-decreasing values from 0 to len(dep_idx).")
        if n == 0:
            return
        if b.op.max() > Op.INTERNAL or b.channel.max() > Channel.SYSTEM:
            raise MemoryMonitorError("Batch holds an unknown op or channel code.")
        n_ns, n_keys = len(self._ns_names), len(self._key_names)
        if b.session.min() <= SHARED_CODE or b.session.max() >= n_ns:
            raise NamespaceError("Batch session codes must name interned session namespaces (not the shared one).")
        keys = b.key[b.op != Op.INTERNAL]
        if b.namespace.min() < 0 or b.namespace.max() >= n_ns or (
                keys.size and (keys.min() < 0 or keys.max() >= n_keys)):
            raise MemoryMonitorError("Batch namespace/key codes must come from intern_namespaces/intern_keys.")
        if b.dep_idx.size and (b.dep_idx.min() < 0 or b.dep_idx.max() >= len(self._node_taint)):
            raise UnknownBeliefError("Batch dependencies must name existing belief nodes.")
        for code in np.unique(b.session).tolist():
            if self._ns_names[code] not in self._sessions_ok:
                self._check_session(self._ns_names[code])

    def _np_state(self) -> tuple[np.ndarray, ...]:
        """Numpy mirrors (key head, slot next, slot ns, slot taint, node taint, node own, key ι).

        Slots and nodes are append-only, so each mirror copies only what was appended since the
        last batch; taint of existing slots is patched from the list of updated slots.
        """
        n_slots, n_keys = len(self._slot_value), len(self._key_names)
        mir = self._mirrors
        old_slots = mir["slot_ns"].n
        slot_ns = mir["slot_ns"].sync(self._slot_ns)
        slot_next = mir["slot_next"].sync(self._slot_next)
        slot_taint = mir["slot_taint"].sync(self._slot_taint)
        if self._taint_dirty:
            idx = np.fromiter(self._taint_dirty, np.int64, len(self._taint_dirty))
            st = self._slot_taint
            slot_taint[idx] = np.fromiter((st[i] for i in self._taint_dirty), np.uint8, len(self._taint_dirty))
            self._taint_dirty = []
        head = self._np_head
        if head.shape[0] < n_keys:
            grown = np.full(max(n_keys, 2 * head.shape[0], 1024), -1, np.int64)
            grown[: head.shape[0]] = head
            head = self._np_head = grown
        if n_slots > old_slots:
            keys = np.frombuffer(self._slot_key[old_slots:n_slots], np.int64)
            np.maximum.at(head, keys, np.arange(old_slots, n_slots, dtype=np.int64))
        node_taint = mir["node_taint"].sync(self._node_taint)
        node_own = mir["node_own"].sync(self._node_own)
        key_immut = mir["key_immut"].sync(self._key_immut)
        return head, slot_next, slot_ns, slot_taint, node_taint, node_own, key_immut

    def _reset_mirrors(self) -> None:
        self._mirrors = {
            "slot_ns": _Tail(np.int64), "slot_next": _Tail(np.int64), "slot_taint": _Tail(np.uint8),
            "node_taint": _Tail(np.uint8), "node_own": _Tail(np.uint8), "key_immut": _Tail(np.uint8),
        }
        self._np_head = np.full(1024, -1, np.int64)
        self._taint_dirty = []

    @staticmethod
    def _lookup(ns: np.ndarray, key: np.ndarray, head: np.ndarray, slot_next: np.ndarray,
                slot_ns: np.ndarray) -> np.ndarray:
        """Slot of each (namespace, key), or -1: walk the per-key slot chains, all rows at once."""
        out = np.full(ns.shape[0], -1, np.int64)
        cand = head[key]
        active = np.flatnonzero(cand >= 0)
        c = cand[active]
        while active.size:
            hit = slot_ns[c] == ns[active]
            out[active[hit]] = c[hit]
            miss = ~hit
            active, c = active[miss], slot_next[c[miss]]
            keep = c >= 0
            active, c = active[keep], c[keep]
        return out

    def _decide_batch(self, b: BatchActions) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Rules 1-9 over a whole batch with the same result as deciding it one action at a time.

        WRITE decisions never depend on M_t (only on ι(k), deps, π, σ), and accepted WRITEs and
        PROMOTEs only ever leave an item present with τ = 0. So a PROMOTE (or READ) sees the pre-batch
        item unless an accepted mutation hit the same (namespace, key) earlier in the batch; that is
        found with one ``minimum.at`` over slot ids (new items get ids past the last slot).
        """
        self._validate_batch(b)
        n = len(b)
        head, slot_next, slot_ns, slot_taint, node_taint, node_own, key_immut = self._np_state()
        n_slots = len(self._slot_value)
        op, ns, key = b.op, b.namespace, b.key
        is_w, is_p, is_r = op == Op.WRITE, op == Op.PROMOTE, op == Op.READ
        trusted = TRUSTED_LUT[b.channel]
        own = ns == b.session
        immut = key_immut[key].astype(np.bool_)
        if b.dep_idx.size:
            t = node_taint[b.dep_idx]
            dep_t = _segment_any(t, b.dep_ptr)
            dep_i = _segment_any(t & (node_own[b.dep_idx] ^ 1), b.dep_ptr)
        else:
            dep_t = dep_i = np.zeros(n, np.bool_)
        # WRITE: Rules 3, 4 (+8), 5, 9, else Rule 2
        w3, w4, w5, w9 = is_w & immut, is_w & dep_t, is_w & ~trusted, is_w & ~own
        w8 = w4 & dep_i
        w_ok = is_w & ~(w3 | w4 | w5 | w9)
        # pre-batch item at (namespace, key) for the rows that need it
        r9 = is_r & ~(own | (ns == SHARED_CODE))
        pin = is_p & own
        need = np.flatnonzero(pin | (is_r & ~r9) | w_ok)
        slot = np.full(n, -1, np.int64)
        slot[need] = self._lookup(ns[need], key[need], head, slot_next, slot_ns)
        found = slot >= 0
        pre_taint = np.zeros(n, np.bool_)
        pre_taint[found] = slot_taint[slot[found]].astype(np.bool_)
        sid = (ns.astype(np.int64) << _KEY_BITS) | key.astype(np.int64)
        w_rows = np.flatnonzero(w_ok)
        w_new = sid[w_rows[~found[w_rows]]]
        # PROMOTE: Rule 9, then Rule 7 (authorizer, existence, taint) and Rule 3, else Rule 6
        p_rows = np.flatnonzero(pin)
        wb = _hit_before(n_slots, np.unique(w_new), w_rows, found[w_rows], slot[w_rows], sid[w_rows],
                         p_rows, found[p_rows], slot[p_rows], sid[p_rows], n)
        p_exists = found[p_rows] | wb
        p_taint = pre_taint[p_rows] & ~wb
        p_tr = trusted[p_rows]
        r7 = np.where(~p_tr, 1, np.where(~p_exists, 2, np.where(p_taint, 3, 0))).astype(np.uint8)
        p_idx = np.zeros(n, np.uint8)
        p_idx[is_p & ~own] = 1
        p_idx[p_rows] = (immut[p_rows].astype(np.uint8) << 1) | (r7 << 2)
        p_ok = np.zeros(n, np.bool_)
        p_ok[p_rows] = p_idx[p_rows] == 0
        # READ: Rule 9, else Rule 1, seeing accepted WRITEs and PROMOTEs earlier in the batch
        pr = np.flatnonzero(p_ok)
        pkey = key[pr].astype(np.int64)  # (shared, key): the shared namespace code is 0
        p_slot = self._lookup(np.zeros(pr.size, ns.dtype), key[pr], head, slot_next, slot_ns)
        p_found = p_slot >= 0
        m_virtual = np.unique(np.concatenate((w_new, pkey[~p_found])))
        r_rows = np.flatnonzero(is_r & ~r9)
        mb = _hit_before(n_slots, m_virtual, np.concatenate((w_rows, pr)),
                         np.concatenate((found[w_rows], p_found)), np.concatenate((slot[w_rows], p_slot)),
                         np.concatenate((sid[w_rows], pkey)), r_rows, found[r_rows], slot[r_rows], sid[r_rows], n)
        r_exists = found[r_rows] | mb
        r_ok = np.zeros(n, np.bool_)
        r_ok[r_rows] = r_exists
        r_taint = np.zeros(n, np.bool_)
        r_taint[r_rows] = pre_taint[r_rows] & ~mb
        # pack: the same code tables as the single-call path, indexed by op and rule premises
        u8 = np.uint8
        idx = (op.astype(u8) << 5) | w3.astype(u8) | (w4.astype(u8) << 1) | (w8.astype(u8) << 2) \
            | (w5.astype(u8) << 3) | (w9.astype(u8) << 4) | p_idx | r9.astype(u8) | (r_ok.astype(u8) << 1)
        codes = _BATCH_CODES[idx]
        return codes, {"w_ok": w_ok, "p_ok": p_ok, "r_ok": r_ok, "r_taint": r_taint, "sid": sid, "slot": slot}

    def _audit_names(self) -> None:
        if self.audit is None:
            return
        n_ns, n_keys = self._names_logged
        if n_ns < len(self._ns_names) or n_keys < len(self._key_names):
            self.audit.append("names", {"namespaces_from": n_ns, "namespaces": self._ns_names[n_ns:],
                                        "keys_from": n_keys, "keys": self._key_names[n_keys:]})
            self._names_logged = (len(self._ns_names), len(self._key_names))

    def _audit_batch(self, kind: str, b: BatchActions, codes: np.ndarray, nodes: np.ndarray,
                     header: dict[str, Any]) -> None:
        if self.audit is None:
            return
        if b.claimed is not None:  # what the model claimed is logged (sparse: row -> claim), never used
            claims = {str(i): c for i, c in enumerate(b.claimed) if c is not None}
            if claims:
                header = {**header, "claimed": claims}
        self._audit_names()
        self.audit.append_arrays(kind, {"n": len(b), **header}, {
            "op": b.op, "session": b.session, "namespace": b.namespace, "key": b.key, "channel": b.channel,
            "dep_ptr": b.dep_ptr, "dep_idx": b.dep_idx, "code": codes, "node": nodes,
        })

    def check_batch(self, batch: BatchActions) -> BatchDecisions:
        """Decide a batch without committing (a dry run), exactly as ``submit_batch`` would; audited.

        The §9.5 USER-channel policy is not applied (it needs a diff per write); see submit_batch.
        """
        codes, _ = self._decide_batch(batch)
        nodes = np.full(len(batch), -1, np.int64)
        self._audit_batch("batch_check", batch, codes, nodes, {})
        return BatchDecisions(codes, nodes)

    def submit_batch(self, batch: BatchActions) -> BatchDecisions:
        """Decide and commit a batch in order (same result as one ``submit`` per action); audited.

        With a UserChannel attached, USER-channel WRITE/PROMOTE must go through the single-call API
        (each one gets its own diff and review), so a batch holding them is refused.
        """
        b = batch
        if self.user_channel is not None and len(b) and bool(
                np.any(((b.op == Op.WRITE) | (b.op == Op.PROMOTE)) & (b.channel == Channel.USER))):
            raise UserChannelError(
                "USER-channel writes and promotions are reviewed one by one (diff view, rate limit, content "
                "check); submit them with write()/promote(), not in a batch."
            )
        write_values, values_digest = self._batch_write_values(b)
        codes, f = self._decide_batch(b)
        w_ok, p_ok, r_ok = f["w_ok"], f["p_ok"], f["r_ok"]
        mut = np.flatnonzero(w_ok | p_ok)
        if mut.size:
            self._commit_batch(b, mut, f["slot"][mut])
        nodes = np.full(len(b), -1, np.int64)
        reads = np.flatnonzero(r_ok)
        base = len(self._node_taint)
        if reads.size:
            nodes[reads] = np.arange(base, base + reads.size, dtype=np.int64)
            taint = f["r_taint"][reads].astype(np.uint8)
            self._node_taint.extend(taint.tobytes())
            self._node_own.extend(taint.tobytes())
            self._node_kind.extend(bytes([NodeKind.READ]) * reads.size)
            self._node_ref.frombytes(f["sid"][reads].astype(np.int64).tobytes())
            read_sessions = b.session[reads]
            self._node_session.frombytes(read_sessions.astype(np.int64).tobytes())
            order = np.argsort(read_sessions, kind="stable")
            sess_sorted = read_sessions[order]
            bounds = np.flatnonzero(np.diff(sess_sorted)) + 1
            for chunk_nodes, chunk_taint, code in zip(np.split(nodes[reads][order], bounds),
                                                      np.split(taint[order], bounds),
                                                      sess_sorted[np.r_[0, bounds]].tolist()):
                name = self._ns_names[code]
                self._context.setdefault(name, []).extend(chunk_nodes.tolist())
                self._context_taint[name] = int(self._context_taint.get(name, 0) or bool(chunk_taint.any()))
        self._started = True
        header: dict[str, Any] = {"first_node": base, "n_writes": write_values, "values_sha256": values_digest}
        self._audit_batch("batch", b, codes, nodes, header)
        return BatchDecisions(codes, nodes)

    def _commit_batch(self, b: BatchActions, mut: np.ndarray, pre_slot: np.ndarray) -> None:
        """Apply accepted mutations in batch order (Rule 2 / Rule 6 effects), inlined for speed."""
        values = b.values
        ns_names, key_names, index = self._ns_names, self._key_names, self._index
        sv, sc, st, si = self._slot_value, self._slot_channel, self._slot_taint, self._slot_immut
        dirty_add, tdirty_append = self._dirty.add, self._taint_dirty.append
        shared = self.shared
        for i, o, nsc, kc, ch, s in zip(mut.tolist(), b.op[mut].tolist(), b.namespace[mut].tolist(),
                                        b.key[mut].tolist(), b.channel[mut].tolist(), pre_slot.tolist()):
            if o == Op.WRITE:
                if s >= 0:  # the item existed before the batch: update in place
                    sv[s] = values[i]  # type: ignore[index]
                    sc[s] = ch
                    st[s] = 0
                    dirty_add(s)
                    tdirty_append(s)
                else:
                    self._commit_write(ns_names[nsc], key_names[kc], values[i], ch)  # type: ignore[index]
            else:
                key = key_names[kc]
                src = index[ns_names[nsc]][key]
                tgt = index.get(shared, {}).get(key)
                if tgt is None:
                    self._commit_promote(ns_names[nsc], key)
                else:
                    sv[tgt], sc[tgt], st[tgt], si[tgt] = sv[src], sc[src], st[src], si[src]
                    dirty_add(tgt)
                    tdirty_append(tgt)

    @staticmethod
    def _batch_write_values(b: BatchActions) -> tuple[int, str | None]:
        """Check every WRITE row has a str value; digest them (lengths + NUL-joined UTF-8) for the audit."""
        writes = np.flatnonzero(b.op == Op.WRITE)
        if writes.size == 0:
            return 0, None
        if b.values is None or len(b.values) != len(b):
            raise MemoryMonitorError("submit_batch needs `values` (one per action) when the batch holds WRITEs.")
        picked = list(itemgetter(*writes.tolist())(b.values)) if writes.size > 1 else [b.values[int(writes[0])]]
        try:
            joined = "\x00".join(picked)  # type: ignore[arg-type]
        except TypeError:
            raise MemoryMonitorError("Every WRITE in a batch needs a str value.") from None
        lengths = np.fromiter(map(len, picked), np.int64, len(picked))
        return len(picked), sha256_bytes(lengths.tobytes() + joined.encode())

    def submit_many(self, actions: Sequence[Action]) -> BatchDecisions:
        return self.submit_batch(self.encode(actions))
