"""Rules 1-9 of seed 002 §3.3-3.4: the packed decision codes and the single-call deciders.

This is the reference semantics; ``batch.py`` indexes ``BATCH_CODES``, built here from the same
tables, so both paths give the same code. Every call returns a ``Decision`` naming the rule that
decided and every rule whose premise held. Seed-level choices (documented once here):

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
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from rvu_pipelines.bounded_io import truncate_for_message
from rvu_pipelines.errors import MemoryMonitorError, ProvenanceError
from rvu_pipelines.memory.audit import AuditLog, encode_decision
from rvu_pipelines.memory.model import (
    DECISIONS,
    TRUST_BY_CHANNEL,
    Action,
    Channel,
    Decision,
    Internal,
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
from rvu_pipelines.memory.user_channel import ContentCheck, ContentVerdict, UserChannel
from rvu_pipelines.text_rules import lone_surrogate_at

SHARED_CODE = 0
_B0, _B1, _B2, _B3, _B4, _B5, _B6, _B7, _B8, _B9, _B10, _B11 = (1 << r for r in range(12))
_WRITE_REJECT_BITS = _B3 | _B4 | _B5 | _B9
KEY_BITS = 32  # a (namespace, key) pair packs into one int: namespace << KEY_BITS | key

# ---------------------------------------------------------------- precomputed decision codes


def _write_code(mask: int) -> int:
    if not mask & _WRITE_REJECT_BITS:
        return pack_decision(Op.WRITE, True, Rule.R2_WRITE, Reason.ACCEPTED, _B2)
    for bit, rule, reason in (
        (_B3, Rule.R3_IMMUTABLE, Reason.IMMUTABLE),
        (_B4, Rule.R4_TAINTED, Reason.TAINTED_DEPS),
        (_B5, Rule.R5_UNTRUSTED, Reason.UNTRUSTED_PRINCIPAL),
        (_B9, Rule.R9_NAMESPACE, Reason.NOT_VISIBLE),
    ):
        if mask & bit:
            return pack_decision(Op.WRITE, False, rule, reason, mask)
    raise AssertionError(mask)


_WRITE_CODES: dict[int, int] = {
    m: _write_code(m) for m in range(1 << 11) if not m & ~(_B3 | _B4 | _B5 | _B8 | _B9) and (not m & _B8 or m & _B4)
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
WRITE_CONTENT_REJECTED = pack_decision(Op.WRITE, False, Rule.WRITE_CHECK, Reason.CONTENT_REJECTED, _B11)
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


BATCH_CODES = _batch_codes()  # the batch path's decision table (memory.batch)
TRUSTED_BY_CHANNEL = tuple(t is Trust.TRUSTED for t in TRUST_BY_CHANNEL)
_USER = Channel.USER


class SingleCallPath:
    """The single-call half of ``ReferenceMonitor`` (mixed in): one action, one decision."""

    # ReferenceMonitor's state and helpers used here (monitor.py sets them), declared for the type checker
    shared: str
    audit: AuditLog | None
    user_channel: UserChannel | None
    write_check: ContentCheck | None
    _sessions_ok: set[str]
    _immutable_keys: set[str]
    _index: dict[str, dict[str, int]]
    _key_code: dict[str, int]
    _ns_code: dict[str, int]
    _slot_value: list[str]
    _slot_taint: bytearray
    _slot_ns: array
    _slot_key: array
    _started: bool
    _check_name: Callable[[object, str], None]
    _check_session: Callable[[object], None]
    _provenance_error: Callable[[object], ProvenanceError]
    _deps_taint: Callable[[Iterable[int]], tuple[int, int]]
    _add_node: Callable[[int, str, int, int, int], int]
    _commit_write: Callable[[str, str, str, int], None]
    _commit_promote: Callable[[str, str], None]

    # ------------------------------------------------------------------ the rules, single call

    def write(
        self,
        session: str,
        key: str,
        value: str,
        *,
        channel: Channel,
        deps: Sequence[int] = (),
        namespace: str | None = None,
        claimed: str | None = None,
    ) -> Decision:
        """WRITE(k, v, deps, π, σ): Rules 2-5 and 9; π is the trust of ``channel``."""
        if session not in self._sessions_ok:
            self._check_session(session)
        if type(channel) is not Channel:
            raise self._provenance_error(channel)
        ns = session
        if namespace is not None:
            self._check_known_name(namespace, self._ns_code, "namespace")
            ns = namespace
        if type(key) is not str or not key or type(value) is not str:
            raise MemoryMonitorError(
                f"WRITE needs a non-empty str key and a str value, got {truncate_for_message(key)}, "
                f"{type(value).__name__}."
            )
        if key not in self._key_code:  # a known key passed the name check when it was interned
            self._check_name(key, "key")
        mask = _B3 if key in self._immutable_keys else 0
        if deps:
            taint, inherited = self._deps_taint(deps)
            if taint:
                mask |= _B4 | _B8 if inherited else _B4
        if not TRUSTED_BY_CHANNEL[channel]:
            mask |= _B5
        if ns != session:
            mask |= _B9
        extra: dict[str, Any] | None = None
        if not value.isascii() and (bad := lone_surrogate_at(value)) is not None:
            # never stored, never shown to a review or a detector: no store or log could hold it
            code = pack_decision(Op.WRITE, False, Rule.WRITE_CHECK, Reason.INVALID_TEXT, mask | _B11)
            extra = {"invalid_text": {"defect": "lone_surrogate", "position": bad}}
        elif channel is _USER and self.user_channel is not None:
            code, extra = self._user_write(session, ns, key, value, mask)
        elif mask:
            code = _WRITE_CODES[mask]
        elif (verdict := self._write_check_verdict(value)) is not None and verdict.flagged:
            code, extra = WRITE_CONTENT_REJECTED, {"write_check": verdict.audit_view()}
        else:
            self._commit_write(ns, key, value, channel)
            code = WRITE_OK
        self._started = True
        if self.audit is not None:
            self.audit.record(
                (
                    encode_decision,
                    Op.WRITE,
                    code,
                    session,
                    ns,
                    key,
                    int(channel),
                    claimed,
                    tuple(deps),
                    value,
                    None,
                    extra,
                )
            )
        return DECISIONS[code]

    def _user_write(self, session: str, ns: str, key: str, value: str, mask: int) -> tuple[int, dict[str, Any]]:
        uc = self.user_channel
        assert uc is not None
        old = None
        if ns == session or ns == self.shared:  # never put another session's content in the diff
            slot = self._index.get(ns, {}).get(key)
            old = None if slot is None else self._slot_value[slot]
        review = uc.review(session, ns, key, old, value, "WRITE")
        extra = review.audit_view()
        if mask:
            code = _WRITE_CODES[mask]
        elif (verdict := self._write_check_verdict(value)) is not None and verdict.flagged:
            code = WRITE_CONTENT_REJECTED
            extra["write_check"] = verdict.audit_view()
        elif not uc.write_allowed():
            code = WRITE_RATE_LIMITED
        elif not uc.approve(review):
            code = WRITE_DECLINED
        else:
            self._commit_write(ns, key, value, _USER)
            uc.note_write()
            code = WRITE_OK
        return code, extra

    def _check_known_name(self, name: object, known: dict[str, int], what: str) -> None:
        """Names seen before passed the check when they were interned; only a new one is checked."""
        if type(name) is not str or name not in known:
            self._check_name(name, what)

    def _write_check_verdict(self, value: str) -> ContentVerdict | None:
        """The write-time content check's verdict on a write the rules would accept (None: no check).

        Unlike the USER channel's advisory check, this one is enforced: a flagged value is rejected
        with Rule.WRITE_CHECK / CONTENT_REJECTED and the verdict lands in the audit record."""
        return None if self.write_check is None else self.write_check.check(value)

    def read(self, session: str, key: str, namespace: str | None = None) -> ReadResult:
        """READ(k, σ): Rule 9 scopes σ to visible(session); Rule 1 adds a node carrying m.τ."""
        if session not in self._sessions_ok:
            self._check_session(session)
        self._check_known_name(key, self._key_code, "key")
        if namespace is not None:
            self._check_known_name(namespace, self._ns_code, "namespace")
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
                ref = self._slot_ns[slot] << KEY_BITS | self._slot_key[slot]
                node = self._add_node(NodeKind.READ, session, ref, taint, taint)
                value = self._slot_value[slot]
                code = READ_OK
        self._started = True
        if self.audit is not None:
            self.audit.record((encode_decision, Op.READ, code, session, ns, key, None, None, (), None, node, None))
        return ReadResult(DECISIONS[code], value, node)

    def promote(self, session: str, key: str, *, authorizer: Channel, source: str | None = None) -> Decision:
        """PROMOTE(k, σ_src, σ_shared): Rule 6 if the authorizer is trusted and τ(m) = 0, else Rule 7."""
        if session not in self._sessions_ok:
            self._check_session(session)
        self._check_known_name(key, self._key_code, "key")
        if source is not None:
            self._check_known_name(source, self._ns_code, "namespace")
        if type(authorizer) is not Channel:
            raise self._provenance_error(authorizer)
        src = session if source is None else source
        extra = None
        if src != session:
            code = PROMOTE_NOT_VISIBLE
        else:
            keys = self._index.get(src)
            slot = None if keys is None else keys.get(key)
            if not TRUSTED_BY_CHANNEL[authorizer]:
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
            self.audit.record(
                (encode_decision, Op.PROMOTE, code, session, src, key, int(authorizer), None, (), None, None, extra)
            )
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
            self.audit.record(
                (
                    encode_decision,
                    Op.INTERNAL,
                    INTERNAL_OK,
                    session,
                    None,
                    None,
                    None,
                    note or None,
                    (),
                    None,
                    None,
                    None,
                )
            )
        return DECISIONS[INTERNAL_OK]

    def submit(self, action: Action) -> Decision:
        """Decide one action of any kind (READ's value: use ``read``)."""
        kind = type(action)
        if kind is Write:
            a: Any = action
            return self.write(
                a.session, a.key, a.value, channel=a.channel, deps=a.deps, namespace=a.namespace, claimed=a.claimed
            )
        if kind is Read:
            return self.read(action.session, action.key, action.namespace).decision  # type: ignore[union-attr]
        if kind is Promote:
            a = action
            return self.promote(a.session, a.key, authorizer=a.authorizer, source=a.source)
        if kind is Internal:
            return self.internal(action.session, action.note)  # type: ignore[union-attr]
        raise MemoryMonitorError(f"Not a memory action: {action!r}")
