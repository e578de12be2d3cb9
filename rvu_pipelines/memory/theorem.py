"""Theorem 1 (§4.2) checked from outside the monitor, over a whole execution.

``TheoremChecker`` wraps a monitor with the same methods (observe, derive, read, write, promote,
...). Around every action it snapshots M_t, diffs the snapshots itself, and keeps its own copy of
the belief graph with taint recomputed from the sources it saw (Rule 8), so a monitor bug shows up
as a violation rather than being trusted:

* Part I: every item that is immutable in M_0 keeps its value; no other item ever becomes immutable.
* Part II: a WRITE whose dependencies are tainted (by the checker's own taint) leaves M unchanged.
* Part III: an item of session namespace σ_i changes only by a WRITE of session σ_i; the shared
  namespace changes only by a TRUSTED PROMOTE of an untainted item of the promoting session; an
  accepted READ returns only items of visible(σ); and at the end no item of σ_i is in visible(σ_j).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rvu_pipelines.memory.model import (
    TRUST_BY_CHANNEL,
    Action,
    Channel,
    Decision,
    Internal,
    MemoryItem,
    Promote,
    Read,
    ReadResult,
    Trust,
    Write,
)
from rvu_pipelines.memory.monitor import ReferenceMonitor

Snapshot = dict[tuple[str, str], tuple[str, int, int, int]]


@dataclass(frozen=True)
class TheoremReport:
    """Which parts held over the execution, with counts and the first violations found."""

    steps: int
    part_i: bool
    part_ii: bool
    part_iii: bool
    rule_8: bool
    tainted_writes: int
    untrusted_modifications: int
    final_pair_checks: int
    violations: tuple[str, ...] = field(default=())

    @property
    def holds(self) -> bool:
        return self.part_i and self.part_ii and self.part_iii and self.rule_8

    def as_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "part_i": self.part_i,
            "part_ii": self.part_ii,
            "part_iii": self.part_iii,
            "rule_8": self.rule_8,
            "holds": self.holds,
            "tainted_writes": self.tainted_writes,
            "untrusted_modifications": self.untrusted_modifications,
            "final_pair_checks": self.final_pair_checks,
            "violations": list(self.violations),
        }


class TheoremChecker:
    """Runs actions through a monitor and checks Theorem 1 Parts I-III at every step."""

    def __init__(self, monitor: ReferenceMonitor, *, max_violations: int = 100) -> None:
        self.monitor = monitor
        self.shared = monitor.shared
        m0 = monitor.snapshot()
        self._immutable0 = {k: v for k, v in m0.items() if v[3]}
        self._taint: list[int] = []
        for node in range(monitor.n_nodes):  # nodes from before the checker was attached
            self._taint.append(int(monitor.node(node).tainted))
        self._ctx: dict[str, list[int]] = {}
        self._max = max_violations
        self.violations: list[str] = []
        self._failed: set[str] = set()
        self.steps = 0
        self.tainted_writes = 0
        self.untrusted_modifications = 0
        self.final_pair_checks = 0

    # -- bookkeeping ---------------------------------------------------------------------------

    def _violate(self, part: str, message: str) -> None:
        self._failed.add(part)
        if len(self.violations) < self._max:
            self.violations.append(f"step {self.steps}: {part}: {message}")

    def _new_node(self, node: int, session: str, taint: int) -> None:
        if node != len(self._taint):
            self._violate("Rule 8", f"node id {node} out of sequence (expected {len(self._taint)})")
        self._taint.append(taint)
        self._ctx.setdefault(session, []).append(node)
        if bool(self.monitor.node(node).tainted) != bool(taint):
            self._violate(
                "Rule 8",
                f"node {node}: monitor taint {self.monitor.node(node).tainted}, max over ancestors is {bool(taint)}",
            )

    def _check_part_i(self, after: Snapshot, changes: dict[tuple[str, str], tuple | None]) -> None:
        for k, v in self._immutable0.items():
            if after.get(k) != v:
                self._violate("Part I", f"immutable item {k} changed from value {v[0][:40]!r}")
        for k, new in changes.items():
            if new is not None and new[3] and k not in self._immutable0:
                self._violate("Part I", f"item {k} became immutable after S_0")

    @staticmethod
    def _diff(before: Snapshot, after: Snapshot) -> dict[tuple[str, str], tuple | None]:
        if before == after:
            return {}
        return {k: after.get(k) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}

    # -- the runtime interface -----------------------------------------------------------------

    def observe(self, session: str, channel: Channel, content: str = "") -> int:
        node = self.monitor.observe(session, channel, content)
        self._new_node(node, session, int(TRUST_BY_CHANNEL[channel] is Trust.UNTRUSTED))
        return node

    def derive(self, session: str, parents: Sequence[int] | None = None) -> int:
        used = list(self._ctx.get(session, ())) if parents is None else list(parents)
        node = self.monitor.derive(session, parents)
        if list(self.monitor.node(node).parents) != used:
            self._violate("Rule 8", f"node {node}: monitor recorded parents differ from the context")
        self._new_node(node, session, max((self._taint[p] for p in used), default=0))
        return node

    def reset_context(self, session: str) -> None:
        self.monitor.reset_context(session)
        self._ctx[session] = []

    def visible(self, session: str) -> list[MemoryItem]:
        return self.monitor.visible(session)

    def snapshot(self) -> Snapshot:
        return self.monitor.snapshot()

    def read(self, session: str, key: str, namespace: str | None = None) -> ReadResult:
        before = self.monitor.snapshot()
        result = self.monitor.read(session, key, namespace)
        after = self.monitor.snapshot()
        self.steps += 1
        ns = session if namespace is None else namespace
        changes = self._diff(before, after)
        if changes:
            self._violate("Part III", f"READ changed memory: {sorted(changes)[:3]}")
        self._check_part_i(after, changes)
        if result.decision.accepted:
            if ns not in (session, self.shared):
                self._violate("Part III", f"session {session} read {ns}/{key} outside visible({session})")
            item = before.get((ns, key))
            if item is None or result.value != item[0]:
                self._violate("Part III", f"READ {ns}/{key} returned a value not in M_t")
            if result.node is None:
                self._violate("Rule 8", "accepted READ added no belief node (Rule 1)")
            else:
                self._new_node(result.node, session, int(item[2]) if item is not None else 1)
        elif result.value is not None or result.node is not None:
            self._violate("Part III", f"rejected READ {ns}/{key} still returned data")
        return result

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
        return self.submit(Write(session, key, value, channel, tuple(deps), namespace, claimed))

    def promote(self, session: str, key: str, *, authorizer: Channel, source: str | None = None) -> Decision:
        return self.submit(Promote(session, key, authorizer, source))

    def internal(self, session: str, note: str = "") -> Decision:
        return self.submit(Internal(session, note))

    def submit(self, action: Action) -> Decision:
        if type(action) is Read:
            return self.read(action.session, action.key, action.namespace).decision
        before = self.monitor.snapshot()
        decision = self.monitor.submit(action)
        after = self.monitor.snapshot()
        self.steps += 1
        changes = self._diff(before, after)
        self._check_part_i(after, changes)
        if type(action) is Write:
            self._check_write(action, decision, before, changes)
        elif type(action) is Promote:
            self._check_promote(action, decision, before, changes)
        elif changes:
            self._violate("Part III", f"INTERNAL changed memory: {sorted(changes)[:3]}")
        return decision

    def _check_write(
        self, a: Write, decision: Decision, before: Snapshot, changes: dict[tuple[str, str], tuple | None]
    ) -> None:
        tainted = any(self._taint[d] for d in a.deps if 0 <= d < len(self._taint))
        untrusted = TRUST_BY_CHANNEL[a.channel] is Trust.UNTRUSTED
        if tainted:
            self.tainted_writes += 1
            if changes or decision.accepted:
                self._violate("Part II", f"WRITE {a.key} with tainted dependencies changed memory")
        if changes and (tainted or untrusted):
            self.untrusted_modifications += len(changes)
        ns = a.namespace or a.session
        if len(changes) > 1:
            self._violate("Part III", f"one WRITE changed {len(changes)} items")
        for (cns, ckey), new in changes.items():
            if new is None:
                self._violate("Part III", f"item {cns}/{ckey} disappeared")
            elif cns != a.session or cns != ns or ckey != a.key or new[0] != a.value or new[2]:
                self._violate("Part III", f"WRITE by session {a.session} changed {cns}/{ckey}")
        if decision.accepted != bool(changes) and not (
            decision.accepted and before.get((ns, a.key)) is not None and before[(ns, a.key)][0] == a.value
        ):
            self._violate("Part III", f"WRITE decision ({decision.explain()}) disagrees with the memory change")

    def _check_promote(
        self, a: Promote, decision: Decision, before: Snapshot, changes: dict[tuple[str, str], tuple | None]
    ) -> None:
        src = a.source or a.session
        if changes and TRUST_BY_CHANNEL[a.authorizer] is Trust.UNTRUSTED:
            self.untrusted_modifications += len(changes)
        if len(changes) > 1:
            self._violate("Part III", f"one PROMOTE changed {len(changes)} items")
        for (cns, ckey), new in changes.items():
            item = before.get((src, a.key))
            ok = (
                new is not None
                and cns == self.shared
                and ckey == a.key
                and src == a.session
                and TRUST_BY_CHANNEL[a.authorizer] is Trust.TRUSTED
                and item is not None
                and not item[2]
                and new[0] == item[0]
            )
            if not ok:
                self._violate(
                    "Part III",
                    f"PROMOTE by {a.session} changed {cns}/{ckey} without a TRUSTED "
                    "promotion of an untainted item of that session",
                )

    # -- the end ------------------------------------------------------------------------------

    def finish(self, sessions: Sequence[str] | None = None) -> TheoremReport:
        """Final Part III check over every ordered pair of session namespaces, then the report."""
        names = sorted(set(sessions or ()) | {ns for ns in self.monitor.namespaces() if ns != self.shared})
        pairs = 0
        for j in names:
            seen = {item.namespace for item in self.monitor.visible(j)}
            if not seen <= {j, self.shared}:
                self._violate("Part III", f"visible({j}) holds items of {sorted(seen - {j, self.shared})}")
            pairs += len(names) - 1
        self.final_pair_checks = pairs
        return self.report()

    def report(self) -> TheoremReport:
        return TheoremReport(
            steps=self.steps,
            part_i="Part I" not in self._failed,
            part_ii="Part II" not in self._failed,
            part_iii="Part III" not in self._failed,
            rule_8="Rule 8" not in self._failed,
            tainted_writes=self.tainted_writes,
            untrusted_modifications=self.untrusted_modifications,
            final_pair_checks=self.final_pair_checks,
            violations=tuple(self.violations),
        )
