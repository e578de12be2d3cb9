"""The memory model of seed 002 §3 as small integer codes.

Items, provenance channels, actions and decisions are plain frozen records; every enum has a small
integer value so the monitor can decide on arrays of codes (numpy) as well as on one call at a time,
and both paths produce the same packed decision code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np


class Channel(IntEnum):
    """The real source a datum arrived on; assigned by the runtime, never by the model (§3.4)."""

    WEB = 0
    TOOL = 1
    SKILL = 2
    USER = 3
    SYSTEM = 4


class Trust(IntEnum):
    """The binary provenance label π of §3.2: the security decision only looks at this."""

    UNTRUSTED = 0
    TRUSTED = 1


TRUST_BY_CHANNEL: tuple[Trust, ...] = (
    Trust.UNTRUSTED,
    Trust.UNTRUSTED,
    Trust.UNTRUSTED,
    Trust.TRUSTED,
    Trust.TRUSTED,
)
UNTRUSTED_CHANNELS: tuple[Channel, ...] = (Channel.WEB, Channel.TOOL, Channel.SKILL)
TRUSTED_CHANNELS: tuple[Channel, ...] = (Channel.USER, Channel.SYSTEM)
# Lookup table for the batch path: trusted[channel_code].
TRUSTED_LUT = np.array([int(t) for t in TRUST_BY_CHANNEL], dtype=np.bool_)


def trust_of(channel: Channel) -> Trust:
    return TRUST_BY_CHANNEL[channel]


class Op(IntEnum):
    """The actions of §3.3; the monitor interposes on WRITE and PROMOTE (and scopes READ)."""

    READ = 0
    WRITE = 1
    PROMOTE = 2
    INTERNAL = 3


class Rule(IntEnum):
    """The rule that decided: values are the paper's rule numbers (0 and 10 are not the paper's rules)."""

    NOT_INTERPOSED = 0  # INTERNAL actions: the monitor does not interpose (§3.3)
    R1_READ = 1
    R2_WRITE = 2
    R3_IMMUTABLE = 3
    R4_TAINTED = 4
    R5_UNTRUSTED = 5
    R6_PROMOTE = 6
    R7_PROMOTE_REJECTED = 7
    R8_TAINT_PROPAGATION = 8
    R9_NAMESPACE = 9
    USER_CHANNEL_POLICY = 10  # §9.5 mitigations (rate limit, declined diff); a policy, not a seed rule
    WRITE_CHECK = 11  # write-time content checks: the platform's text rule and a pluggable one (e.g. MEMSAD, seed 003)


class Reason(IntEnum):
    """Why, within the deciding rule (Rule 7 has three causes, Rule 1 can find nothing)."""

    ACCEPTED = 0
    NOT_INTERPOSED = 1
    IMMUTABLE = 2
    TAINTED_DEPS = 3
    UNTRUSTED_PRINCIPAL = 4
    NOT_VISIBLE = 5
    NOT_FOUND = 6
    UNTRUSTED_AUTHORIZER = 7
    TAINTED_ITEM = 8
    RATE_LIMITED = 9
    USER_DECLINED = 10
    CONTENT_REJECTED = 11  # the monitor's write-time content check flagged the value (Rule.WRITE_CHECK)
    INVALID_TEXT = 12  # the value is not storable text (rvu_pipelines.text_rules; Rule.WRITE_CHECK)


class NodeKind(IntEnum):
    """How a belief node entered B_t: a labelled observation, a READ (Rule 1), or model output."""

    OBSERVE = 0
    READ = 1
    DERIVE = 2


# Packed decision code (uint32): accepted | rule << 1 | reason << 5 | op << 9 | rules-mask << 11.
_RULE_SHIFT, _REASON_SHIFT, _OP_SHIFT, _MASK_SHIFT = 1, 5, 9, 11


def pack_decision(op: int, accepted: bool, rule: int, reason: int, mask: int) -> int:
    return (
        int(accepted)
        | int(rule) << _RULE_SHIFT
        | int(reason) << _REASON_SHIFT
        | int(op) << _OP_SHIFT
        | int(mask) << _MASK_SHIFT
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """The monitor's verdict on one action and every rule whose premise held.

    ``rule`` is the deciding rule (by the precedence documented in monitor.py); ``rules`` holds all
    rules that applied, e.g. an untrusted tainted write to SOUL.md is decided by Rule 3 with rules
    {3, 4, 5}, and a write poisoned through intermediate nodes carries Rule 8 beside Rule 4.
    """

    code: int
    op: Op
    accepted: bool
    rule: Rule
    reason: Reason
    rules: frozenset[Rule]

    @classmethod
    def from_code(cls, code: int) -> Decision:
        mask = code >> _MASK_SHIFT
        return cls(
            code=code,
            op=Op((code >> _OP_SHIFT) & 0x3),
            accepted=bool(code & 1),
            rule=Rule((code >> _RULE_SHIFT) & 0xF),
            reason=Reason((code >> _REASON_SHIFT) & 0xF),
            rules=frozenset(r for r in Rule if mask >> int(r) & 1),
        )

    def explain(self) -> str:
        verdict = "accepted" if self.accepted else "rejected"
        also = sorted(int(r) for r in self.rules if r != self.rule)
        extra = f" (also {', '.join(f'Rule {r}' for r in also)})" if also else ""
        return f"{self.op.name} {verdict} by Rule {int(self.rule)} [{self.reason.name}]{extra}"


class _DecisionTable(dict[int, Decision]):
    """Code -> Decision, built once per distinct code so the hot path allocates nothing."""

    def __missing__(self, code: int) -> Decision:
        decision = Decision.from_code(code)
        self[code] = decision
        return decision


DECISIONS = _DecisionTable()


def decision_of(code: int) -> Decision:
    return DECISIONS[int(code)]


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """m = (key, val, π, τ, ι, σ) of §3.2; ``channel`` is the concrete origin label behind π."""

    namespace: str
    key: str
    value: str
    channel: Channel
    tainted: bool = False
    immutable: bool = False

    @property
    def trust(self) -> Trust:
        return TRUST_BY_CHANNEL[self.channel]


@dataclass(frozen=True, slots=True)
class BeliefNode:
    """A node of B_t; ``tainted`` is the max over its ancestors (Rule 8), ``own_taint`` its own label."""

    id: int
    kind: NodeKind
    session: str
    tainted: bool
    own_taint: bool
    parents: tuple[int, ...]
    channel: Channel | None = None  # OBSERVE nodes
    source: tuple[str, str] | None = None  # READ nodes: (namespace, key)


class ReadResult(NamedTuple):
    """A READ's decision, the value (None is ⊥) and the belief node Rule 1 added (None if none)."""

    decision: Decision
    value: str | None
    node: int | None


# ---------------------------------------------------------------- actions (the runtime's proposals)


@dataclass(frozen=True, slots=True)
class Read:
    """READ(k, σ) issued in ``session``; σ defaults to the session's own namespace."""

    session: str
    key: str
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """WRITE(k, v, deps, π, σ); π comes from ``channel`` (runtime-assigned); ``claimed`` is only logged."""

    session: str
    key: str
    value: str
    channel: Channel
    deps: tuple[int, ...] = ()
    namespace: str | None = None
    claimed: str | None = None


@dataclass(frozen=True, slots=True)
class Promote:
    """PROMOTE(k, σ_src, σ_shared) authorised through ``authorizer``; σ_src defaults to the session."""

    session: str
    key: str
    authorizer: Channel
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Internal:
    """INTERNAL(...): inference, tool calls, responses; not interposed, logged for completeness."""

    session: str
    note: str = ""


Action = Read | Write | Promote | Internal


# ---------------------------------------------------------------- batches


@dataclass(frozen=True)
class BatchActions:
    """Many actions as integer-code arrays (build with ``ReferenceMonitor.encode``).

    ``namespace`` is σ for READ/WRITE and σ_src for PROMOTE; ``channel`` is the principal for WRITE
    and the authorizer for PROMOTE. Dependencies are CSR: action i depends on
    ``dep_idx[dep_ptr[i]:dep_ptr[i + 1]]``. ``values`` holds WRITE values (needed to commit).
    """

    op: np.ndarray  # uint8 Op
    session: np.ndarray  # int32 namespace code of the acting session
    namespace: np.ndarray  # int32 namespace code
    key: np.ndarray  # int32 key code
    channel: np.ndarray  # uint8 Channel
    dep_ptr: np.ndarray  # int64, len n + 1
    dep_idx: np.ndarray  # int64 belief node ids
    values: Sequence[str | None] | None = None
    claimed: Sequence[str | None] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.op.shape[0])


@dataclass(frozen=True)
class BatchDecisions:
    """Packed decision codes per action; ``nodes`` holds the belief node a READ added, else -1."""

    codes: np.ndarray  # uint32
    nodes: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    @property
    def accepted(self) -> np.ndarray:
        return (self.codes & 1).astype(np.bool_)

    @property
    def rule(self) -> np.ndarray:
        return ((self.codes >> _RULE_SHIFT) & 0xF).astype(np.uint8)

    @property
    def reason(self) -> np.ndarray:
        return ((self.codes >> _REASON_SHIFT) & 0xF).astype(np.uint8)

    @property
    def rules_mask(self) -> np.ndarray:
        return (self.codes >> _MASK_SHIFT).astype(np.uint32)

    def decision(self, i: int) -> Decision:
        return DECISIONS[int(self.codes[i])]

    def decisions(self) -> list[Decision]:
        return [DECISIONS[c] for c in self.codes.tolist()]

    def counts_by_rule(self) -> dict[str, int]:
        """Deciding-rule histogram, e.g. {'accepted:R2_WRITE': 10, 'rejected:R4_TAINTED': 3}, sorted."""
        uniq, counts = np.unique(self.codes & np.uint32(0x1F), return_counts=True)
        out: dict[str, int] = {}
        for code, count in zip(uniq.tolist(), counts.tolist(), strict=True):  # np.unique: one count per value
            verdict = "accepted" if code & 1 else "rejected"
            name = f"{verdict}:{Rule(code >> _RULE_SHIFT).name}"
            out[name] = out.get(name, 0) + int(count)
        return dict(sorted(out.items()))
