"""The batched path of ``ReferenceMonitor``: Rules 1-9 over numpy code arrays.

``encode`` turns actions into a ``BatchActions``; ``check_batch``/``submit_batch`` decide it in one
vectorised pass that must give, code for code, what ``rules.py`` decides one call at a time (the
tests compare the two). Kept apart because it changes for speed, not for the rules; every method reads and
updates the same numpy mirrors of the monitor's state.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, cast

import numpy as np

from rvu_pipelines.errors import (
    MemoryMonitorError,
    NamespaceError,
    ProvenanceError,
    UnknownBeliefError,
    UserChannelError,
)
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.memory.audit import AuditLog
from rvu_pipelines.memory.model import (
    TRUSTED_LUT,
    Action,
    BatchActions,
    BatchDecisions,
    Channel,
    Internal,
    NodeKind,
    Op,
    Promote,
    Read,
    Write,
)
from rvu_pipelines.memory.rules import BATCH_CODES, KEY_BITS, SHARED_CODE, WRITE_CONTENT_REJECTED
from rvu_pipelines.memory.user_channel import ContentCheck, UserChannel
from rvu_pipelines.text_rules import text_problem

# ---------------------------------------------------------------- helpers for the batch path


class _Tail:
    """Numpy mirror of an append-only array('q')/bytearray that copies only the new tail."""

    def __init__(self, dtype: type) -> None:
        self.buf: np.ndarray = np.zeros(1024, dtype)
        self.n = 0

    def sync(self, src: array | bytearray) -> np.ndarray:
        m = len(src)
        if m > self.n:
            if m > self.buf.shape[0]:
                grown = np.zeros(max(m, 2 * self.buf.shape[0]), self.buf.dtype)
                grown[: self.n] = self.buf[: self.n]
                self.buf = grown
            self.buf[self.n : m] = np.frombuffer(src[self.n : m], self.buf.dtype)
            self.n = m
        return self.buf[:m]


def _hit_before(
    n_slots: int,
    virtual: np.ndarray,
    m_rows: np.ndarray,
    m_found: np.ndarray,
    m_slot: np.ndarray,
    m_sid: np.ndarray,
    q_rows: np.ndarray,
    q_found: np.ndarray,
    q_slot: np.ndarray,
    q_sid: np.ndarray,
    n: int,
) -> np.ndarray:
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


def _check_header(found: dict[str, Any]) -> dict[str, Any]:
    """The write check's rejections for a batch's audit header (nothing when it rejected nothing)."""
    return {"write_check": found["write_check"]} if found.get("write_check") else {}


def _segment_any(flags: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    csum = np.empty(flags.shape[0] + 1, dtype=np.int64)
    csum[0] = 0
    np.cumsum(flags, dtype=np.int64, out=csum[1:])
    return (csum[ptr[1:]] - csum[ptr[:-1]]) > 0


class BatchPath:
    """The batched half of ``ReferenceMonitor`` (mixed in): numpy mirrors of its state and Rules 1-9."""

    # ReferenceMonitor's state and helpers used here (monitor.py sets them), declared for the type checker
    shared: str
    audit: AuditLog | None
    user_channel: UserChannel | None
    write_check: ContentCheck | None
    _ns_names: list[str]
    _key_names: list[str]
    _key_immut: bytearray
    _names_logged: tuple[int, int]
    _index: dict[str, dict[str, int]]
    _slot_ns: array
    _slot_key: array
    _slot_next: array
    _slot_value: list[str]
    _slot_channel: bytearray
    _slot_taint: bytearray
    _slot_immut: bytearray
    _dirty: set[int]
    _node_taint: bytearray
    _node_own: bytearray
    _node_kind: bytearray
    _node_ref: array
    _node_session: array
    _context: dict[str, list[int]]
    _context_taint: dict[str, int]
    _sessions_ok: set[str]
    _started: bool
    _check_session: Callable[[object], None]
    _provenance_error: Callable[[object], ProvenanceError]
    _intern_ns: Callable[[str], int]
    _intern_key: Callable[[str], int]
    _commit_write: Callable[[str, str, str, int], None]
    _commit_promote: Callable[[str, str], None]
    # the numpy mirrors this path keeps (set by _reset_mirrors)
    _mirrors: dict[str, _Tail]
    _np_head: np.ndarray
    _taint_dirty: list[int]

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
            if isinstance(a, Write):
                if type(a.channel) is not Channel:
                    raise self._provenance_error(a.channel)
                if type(a.value) is not str:
                    raise MemoryMonitorError(f"WRITE value must be str, got {type(a.value).__name__}.")
                op[i], cha[i], values[i], claimed[i] = Op.WRITE, a.channel, a.value, a.claimed
                nsa[i] = self._intern_ns(a.session if a.namespace is None else a.namespace)
                keya[i] = self._intern_key(a.key)
                deps.extend(a.deps)
            elif isinstance(a, Read):
                op[i] = Op.READ
                nsa[i] = self._intern_ns(a.session if a.namespace is None else a.namespace)
                keya[i] = self._intern_key(a.key)
            elif isinstance(a, Promote):
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
        if b.dep_ptr.shape != (n + 1,) or (
            n and (b.dep_ptr[0] != 0 or b.dep_ptr[-1] != b.dep_idx.shape[0] or np.any(np.diff(b.dep_ptr) < 0))
        ):
            raise MemoryMonitorError(
                "Batch dep_ptr must be CSR offsets: n+1 non-decreasing values from 0 to len(dep_idx)."
            )
        if n == 0:
            return
        if b.op.max() > Op.INTERNAL or b.channel.max() > Channel.SYSTEM:
            raise MemoryMonitorError("Batch holds an unknown op or channel code.")
        n_ns, n_keys = len(self._ns_names), len(self._key_names)
        if b.session.min() <= SHARED_CODE or b.session.max() >= n_ns:
            raise NamespaceError("Batch session codes must name interned session namespaces (not the shared one).")
        keys = b.key[b.op != Op.INTERNAL]
        if (
            b.namespace.min() < 0
            or b.namespace.max() >= n_ns
            or (keys.size and (keys.min() < 0 or keys.max() >= n_keys))
        ):
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
            "slot_ns": _Tail(np.int64),
            "slot_next": _Tail(np.int64),
            "slot_taint": _Tail(np.uint8),
            "node_taint": _Tail(np.uint8),
            "node_own": _Tail(np.uint8),
            "key_immut": _Tail(np.uint8),
        }
        self._np_head = np.full(1024, -1, np.int64)
        self._taint_dirty = []

    @staticmethod
    def _lookup(
        ns: np.ndarray, key: np.ndarray, head: np.ndarray, slot_next: np.ndarray, slot_ns: np.ndarray
    ) -> np.ndarray:
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

    def _decide_batch(self, b: BatchActions) -> tuple[np.ndarray, dict[str, Any]]:
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
        # the enforced content check, on the writes the rules accept (as the single-call path runs it)
        rejected, verdicts = self._content_rejected(b, w_ok)
        w_ok &= ~rejected
        # pre-batch item at (namespace, key) for the rows that need it
        r9 = is_r & ~(own | (ns == SHARED_CODE))
        pin = is_p & own
        need = np.flatnonzero(pin | (is_r & ~r9) | w_ok)
        slot = np.full(n, -1, np.int64)
        slot[need] = self._lookup(ns[need], key[need], head, slot_next, slot_ns)
        found = slot >= 0
        pre_taint = np.zeros(n, np.bool_)
        pre_taint[found] = slot_taint[slot[found]].astype(np.bool_)
        sid = (ns.astype(np.int64) << KEY_BITS) | key.astype(np.int64)
        w_rows = np.flatnonzero(w_ok)
        w_new = sid[w_rows[~found[w_rows]]]
        # PROMOTE: Rule 9, then Rule 7 (authorizer, existence, taint) and Rule 3, else Rule 6
        p_rows = np.flatnonzero(pin)
        wb = _hit_before(
            n_slots,
            np.unique(w_new),
            w_rows,
            found[w_rows],
            slot[w_rows],
            sid[w_rows],
            p_rows,
            found[p_rows],
            slot[p_rows],
            sid[p_rows],
            n,
        )
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
        mb = _hit_before(
            n_slots,
            m_virtual,
            np.concatenate((w_rows, pr)),
            np.concatenate((found[w_rows], p_found)),
            np.concatenate((slot[w_rows], p_slot)),
            np.concatenate((sid[w_rows], pkey)),
            r_rows,
            found[r_rows],
            slot[r_rows],
            sid[r_rows],
            n,
        )
        r_exists = found[r_rows] | mb
        r_ok = np.zeros(n, np.bool_)
        r_ok[r_rows] = r_exists
        r_taint = np.zeros(n, np.bool_)
        r_taint[r_rows] = pre_taint[r_rows] & ~mb
        # pack: the same code tables as the single-call path, indexed by op and rule premises
        u8 = np.uint8
        idx = (
            (op.astype(u8) << 5)
            | w3.astype(u8)
            | (w4.astype(u8) << 1)
            | (w8.astype(u8) << 2)
            | (w5.astype(u8) << 3)
            | (w9.astype(u8) << 4)
            | p_idx
            | r9.astype(u8)
            | (r_ok.astype(u8) << 1)
        )
        codes = BATCH_CODES[idx]
        codes[rejected] = WRITE_CONTENT_REJECTED
        rows = {"w_ok": w_ok, "p_ok": p_ok, "r_ok": r_ok, "r_taint": r_taint, "sid": sid, "slot": slot}
        return codes, {**rows, "write_check": verdicts}

    def _content_rejected(self, b: BatchActions, w_ok: np.ndarray) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """Rows whose value the write check flags (among ``w_ok``), and their verdicts for the audit header."""
        rejected = np.zeros(len(b), np.bool_)
        if self.write_check is None or not w_ok.any():
            return rejected, []
        assert b.values is not None  # _batch_write_values checked every WRITE has a str value
        verdicts = []
        for row in np.flatnonzero(w_ok).tolist():
            verdict = self.write_check.check(cast("str", b.values[row]))
            if verdict.flagged:
                rejected[row] = True
                verdicts.append({"row": row, **verdict.audit_view()})
        return rejected, verdicts

    def _audit_names(self) -> None:
        if self.audit is None:
            return
        n_ns, n_keys = self._names_logged
        if n_ns < len(self._ns_names) or n_keys < len(self._key_names):
            self.audit.append(
                "names",
                {
                    "namespaces_from": n_ns,
                    "namespaces": self._ns_names[n_ns:],
                    "keys_from": n_keys,
                    "keys": self._key_names[n_keys:],
                },
            )
            self._names_logged = (len(self._ns_names), len(self._key_names))

    def _audit_batch(
        self, kind: str, b: BatchActions, codes: np.ndarray, nodes: np.ndarray, header: dict[str, Any]
    ) -> None:
        if self.audit is None:
            return
        if b.claimed is not None:  # what the model claimed is logged (sparse: row -> claim), never used
            claims = {str(i): c for i, c in enumerate(b.claimed) if c is not None}
            if claims:
                header = {**header, "claimed": claims}
        self._audit_names()
        self.audit.append_arrays(
            kind,
            {"n": len(b), **header},
            {
                "op": b.op,
                "session": b.session,
                "namespace": b.namespace,
                "key": b.key,
                "channel": b.channel,
                "dep_ptr": b.dep_ptr,
                "dep_idx": b.dep_idx,
                "code": codes,
                "node": nodes,
            },
        )

    def check_batch(self, batch: BatchActions) -> BatchDecisions:
        """Decide a batch without committing (a dry run), exactly as ``submit_batch`` would; audited.

        The §9.5 USER-channel policy is not applied (it needs a diff per write); see submit_batch.
        """
        if self.write_check is not None:
            self._batch_write_values(batch)  # the check reads the values: each WRITE needs a str
        codes, f = self._decide_batch(batch)
        nodes = np.full(len(batch), -1, np.int64)
        self._audit_batch("batch_check", batch, codes, nodes, _check_header(f))
        return BatchDecisions(codes, nodes)

    def submit_batch(self, batch: BatchActions) -> BatchDecisions:
        """Decide and commit a batch in order (same result as one ``submit`` per action); audited.

        With a UserChannel attached, USER-channel WRITE/PROMOTE must go through the single-call API
        (each one gets its own diff and review), so a batch holding them is refused.
        """
        b = batch
        if (
            self.user_channel is not None
            and len(b)
            and bool(np.any(((b.op == Op.WRITE) | (b.op == Op.PROMOTE)) & (b.channel == Channel.USER)))
        ):
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
            # one chunk per run of equal sessions: len(bounds) + 1 of each, by construction
            for chunk_nodes, chunk_taint, code in zip(
                np.split(nodes[reads][order], bounds),
                np.split(taint[order], bounds),
                sess_sorted[np.r_[0, bounds]].tolist(),
                strict=True,
            ):
                name = self._ns_names[code]
                self._context.setdefault(name, []).extend(chunk_nodes.tolist())
                self._context_taint[name] = int(self._context_taint.get(name, 0) or bool(chunk_taint.any()))
        self._started = True
        header: dict[str, Any] = {
            "first_node": base,
            "n_writes": write_values,
            "values_sha256": values_digest,
            **_check_header(f),
        }
        self._audit_batch("batch", b, codes, nodes, header)
        return BatchDecisions(codes, nodes)

    def _commit_batch(self, b: BatchActions, mut: np.ndarray, pre_slot: np.ndarray) -> None:
        """Apply accepted mutations in batch order (Rule 2 / Rule 6 effects), inlined for speed."""
        # every WRITE row's value was checked to be a str by _batch_write_values; only WRITE rows index it
        values = cast("list[str]", b.values)
        ns_names, key_names, index = self._ns_names, self._key_names, self._index
        sv, sc, st, si = self._slot_value, self._slot_channel, self._slot_taint, self._slot_immut
        dirty_add, tdirty_append = self._dirty.add, self._taint_dirty.append
        shared = self.shared
        # all six are indexed by (or, pre_slot, taken at) the same `mut` rows: equal length by construction
        for i, o, nsc, kc, ch, s in zip(
            mut.tolist(),
            b.op[mut].tolist(),
            b.namespace[mut].tolist(),
            b.key[mut].tolist(),
            b.channel[mut].tolist(),
            pre_slot.tolist(),
            strict=True,
        ):
            if o == Op.WRITE:
                if s >= 0:  # the item existed before the batch: update in place
                    sv[s] = values[i]
                    sc[s] = ch
                    st[s] = 0
                    dirty_add(s)
                    tdirty_append(s)
                else:
                    self._commit_write(ns_names[nsc], key_names[kc], values[i], ch)
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
        strs = cast("list[str]", picked)  # checked by the join: a non-str value raises TypeError there
        try:
            joined = "\x00".join(strs)
        except TypeError:
            raise MemoryMonitorError("Every WRITE in a batch needs a str value.") from None
        try:
            encoded = joined.encode()
        except UnicodeEncodeError:  # refuse the whole batch before anything is decided or committed
            row, problem = next((int(writes[i]), p) for i, v in enumerate(strs) if (p := text_problem(v)) is not None)
            raise MemoryMonitorError(
                f"WRITE at batch row {row}: its value {problem}. Nothing in the batch was decided or committed."
            ) from None
        lengths = np.fromiter(map(len, strs), np.int64, len(strs))
        return len(picked), sha256_bytes(lengths.tobytes() + encoded)

    def submit_many(self, actions: Sequence[Action]) -> BatchDecisions:
        return self.submit_batch(self.encode(actions))
