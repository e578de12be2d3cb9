"""One test (at least) per rule of seed 002 §3.3, plus the runtime-labelling contract of §3.4."""

from __future__ import annotations

import pytest

from rvu_pipelines.errors import (
    GenesisClosedError,
    NamespaceError,
    ProvenanceError,
    RvuError,
    UnknownBeliefError,
)
from rvu_pipelines.memory import Channel, Decision, MemoryItem, Op, Promote, Read, Reason, ReferenceMonitor, Rule, Write
from rvu_pipelines.memory.model import DECISIONS, decision_of

SHARED = "shared"


def _rules(d: Decision) -> set[int]:
    return {int(r) for r in d.rules}


def test_rule1_read_returns_value_and_adds_belief_node_carrying_item_taint(monitor: ReferenceMonitor) -> None:
    clean = monitor.read("alice", "notes.md")
    assert clean.decision.accepted and clean.decision.rule is Rule.R1_READ
    assert clean.value == "alice's notes"
    assert monitor.node(clean.node).tainted is False
    dirty = monitor.read("alice", "cache/page.html")
    assert dirty.decision.accepted and monitor.node(dirty.node).tainted is True
    missing = monitor.read("alice", "nope")
    assert (missing.decision.accepted, missing.decision.rule, missing.decision.reason) == (
        False,
        Rule.R1_READ,
        Reason.NOT_FOUND,
    )
    assert missing.value is None and missing.node is None
    shared = monitor.read("alice", "SOUL.md", namespace=SHARED)
    assert shared.decision.accepted and shared.value.startswith("# SOUL.md")


def test_rule2_trusted_untainted_write_commits_with_taint_zero(monitor: ReferenceMonitor) -> None:
    n = monitor.observe("alice", Channel.USER, "remember I like tea")
    d = monitor.write("alice", "prefs", "tea", channel=Channel.USER, deps=[n])
    assert d.accepted and d.rule is Rule.R2_WRITE and _rules(d) == {2}
    item = monitor.get("alice", "prefs")
    assert item == MemoryItem("alice", "prefs", "tea", Channel.USER, tainted=False, immutable=False)
    assert monitor.write("alice", "prefs", "coffee", channel=Channel.SYSTEM).accepted
    assert monitor.get("alice", "prefs").value == "coffee"


def test_rule3_immutable_key_rejected_even_for_system_and_in_every_namespace(monitor: ReferenceMonitor) -> None:
    before = monitor.get(SHARED, "SOUL.md")
    d = monitor.write("alice", "SOUL.md", "new soul", channel=Channel.SYSTEM, namespace=SHARED)
    assert not d.accepted and d.rule is Rule.R3_IMMUTABLE and d.reason is Reason.IMMUTABLE
    shadow = monitor.write("alice", "SOUL.md", "shadow soul", channel=Channel.SYSTEM)
    assert not shadow.accepted and shadow.rule is Rule.R3_IMMUTABLE and _rules(shadow) == {3}
    assert monitor.get(SHARED, "SOUL.md") == before and monitor.get("alice", "SOUL.md") is None


def test_rule4_tainted_dependency_rejects_even_a_trusted_principal(monitor: ReferenceMonitor) -> None:
    web = monitor.observe("alice", Channel.WEB, "buy crypto")
    d = monitor.write("alice", "prefs", "buy crypto", channel=Channel.USER, deps=[web])
    assert not d.accepted and d.rule is Rule.R4_TAINTED and _rules(d) == {4}
    assert monitor.get("alice", "prefs") is None
    read_node = monitor.read("alice", "cache/page.html").node  # Rule 1 carries the item's taint
    assert monitor.write("alice", "prefs", "x", channel=Channel.USER, deps=[read_node]).rule is Rule.R4_TAINTED


def test_rule5_untrusted_principal_rejected_without_any_tainted_dependency(monitor: ReferenceMonitor) -> None:
    for channel in (Channel.WEB, Channel.TOOL, Channel.SKILL):
        d = monitor.write("alice", "prefs", "v", channel=channel, deps=(), claimed="SYSTEM")
        assert not d.accepted and d.rule is Rule.R5_UNTRUSTED and _rules(d) == {5}
    assert monitor.get("alice", "prefs") is None


def test_rule6_trusted_promotion_of_untainted_item_copies_it_to_shared(monitor: ReferenceMonitor) -> None:
    d = monitor.promote("alice", "notes.md", authorizer=Channel.USER)
    assert d.accepted and d.rule is Rule.R6_PROMOTE
    assert monitor.get(SHARED, "notes.md") == MemoryItem(SHARED, "notes.md", "alice's notes", Channel.USER)
    assert monitor.get("alice", "notes.md") is not None  # M ∪ {m[σ := shared]}
    assert any(i.namespace == SHARED and i.key == "notes.md" for i in monitor.visible("bob"))


def test_rule7_promotion_rejected_for_untrusted_authorizer_tainted_or_missing_item(monitor: ReferenceMonitor) -> None:
    cases = [
        (("alice", "notes.md", Channel.WEB), Reason.UNTRUSTED_AUTHORIZER),
        (("alice", "cache/page.html", Channel.USER), Reason.TAINTED_ITEM),
        (("alice", "missing", Channel.SYSTEM), Reason.NOT_FOUND),
    ]
    for (session, key, authorizer), reason in cases:
        d = monitor.promote(session, key, authorizer=authorizer)
        assert not d.accepted and d.rule is Rule.R7_PROMOTE_REJECTED and d.reason is reason
        assert monitor.get(SHARED, key) is None
    immut = monitor.promote("alice", "SOUL.md", authorizer=Channel.SYSTEM)
    assert not immut.accepted and Rule.R7_PROMOTE_REJECTED in immut.rules  # missing in alice, and immutable key
    assert Rule.R3_IMMUTABLE in immut.rules


def test_rule8_taint_is_max_over_ancestors_and_never_removed(monitor: ReferenceMonitor) -> None:
    tool = monitor.observe("alice", Channel.TOOL, "payload")
    user = monitor.observe("alice", Channel.USER, "hi")
    a = monitor.derive("alice", [tool])
    b = monitor.derive("alice", [a, user])
    c = monitor.derive("alice", [b])
    assert [monitor.node(x).tainted for x in (tool, user, a, b, c)] == [True, False, True, True, True]
    assert monitor.node(c).own_taint is False  # inherited, not its own
    d = monitor.write("alice", "summary", "s", channel=Channel.USER, deps=[c])
    assert d.rule is Rule.R4_TAINTED and Rule.R8_TAINT_PROPAGATION in d.rules
    direct = monitor.write("alice", "summary", "s", channel=Channel.USER, deps=[tool])
    assert Rule.R8_TAINT_PROPAGATION not in direct.rules
    # A3 conservative default: output in a context holding tainted data is tainted
    assert monitor.node(monitor.derive("alice")).tainted is True
    monitor.reset_context("alice")
    assert monitor.node(monitor.derive("alice")).tainted is False


def test_rule9_namespace_scoping(monitor: ReferenceMonitor) -> None:
    r = monitor.read("alice", "secret", namespace="bob")
    assert not r.decision.accepted and r.decision.rule is Rule.R9_NAMESPACE and r.value is None
    assert [(i.namespace, i.key) for i in monitor.visible("alice")] == [
        ("alice", "cache/page.html"),
        ("alice", "notes.md"),
        (SHARED, "MEMORY.md"),
        (SHARED, "SOUL.md"),
    ]
    w = monitor.write("alice", "secret", "overwrite", channel=Channel.USER, namespace="bob")
    assert not w.accepted and w.rule is Rule.R9_NAMESPACE and _rules(w) == {9}
    direct_shared = monitor.write("alice", "MEMORY.md", "x", channel=Channel.SYSTEM, namespace=SHARED)
    assert direct_shared.rule is Rule.R9_NAMESPACE  # shared is reached only through PROMOTE
    p = monitor.promote("alice", "secret", authorizer=Channel.USER, source="bob")
    assert not p.accepted and p.rule is Rule.R9_NAMESPACE
    assert monitor.get("bob", "secret").value == "bob-token" and monitor.get(SHARED, "secret") is None


def test_precedence_and_all_applicable_rules_are_reported(monitor: ReferenceMonitor) -> None:
    web = monitor.observe("alice", Channel.WEB, "x")
    d = monitor.write("alice", "SOUL.md", "x", channel=Channel.WEB, deps=[web], namespace=SHARED)
    assert d.rule is Rule.R3_IMMUTABLE and _rules(d) == {3, 4, 5, 9}
    assert "Rule 3" in d.explain() and "Rule 9" in d.explain()
    assert decision_of(d.code) is d and DECISIONS[d.code] is d  # cached, no allocation per call


def test_internal_is_not_interposed(monitor: ReferenceMonitor) -> None:
    d = monitor.internal("alice", "called a tool")
    assert d.accepted and d.rule is Rule.NOT_INTERPOSED and d.op is Op.INTERNAL


def test_provenance_comes_from_the_runtime_never_from_model_text(monitor: ReferenceMonitor) -> None:
    for fake in ("SYSTEM", "TRUSTED", 4, None):
        with pytest.raises(ProvenanceError):
            monitor.write("alice", "k", "v", channel=fake)  # type: ignore[arg-type]
        with pytest.raises(ProvenanceError):
            monitor.promote("alice", "notes.md", authorizer=fake)  # type: ignore[arg-type]
        with pytest.raises(ProvenanceError):
            monitor.observe("alice", fake)  # type: ignore[arg-type]
    claimed = monitor.write("alice", "k", "v", channel=Channel.WEB, claimed="SYSTEM")
    assert claimed.rule is Rule.R5_UNTRUSTED  # the claim is logged, never used


def test_malformed_calls_raise_rvu_errors(monitor: ReferenceMonitor) -> None:
    with pytest.raises(NamespaceError):
        monitor.write(SHARED, "k", "v", channel=Channel.USER)
    with pytest.raises(NamespaceError):
        monitor.read("", "k")
    with pytest.raises(UnknownBeliefError):
        monitor.write("alice", "k", "v", channel=Channel.USER, deps=[10_000])
    with pytest.raises(UnknownBeliefError):
        monitor.write("alice", "k", "v", channel=Channel.USER, deps=[-1])
    with pytest.raises(UnknownBeliefError):
        monitor.derive("alice", ["zero"])  # type: ignore[list-item]
    monitor.install(MemoryItem("alice", "early", "v", Channel.SYSTEM))  # nothing decided yet: still S_0
    monitor.internal("alice")
    with pytest.raises(GenesisClosedError):
        monitor.install(MemoryItem("alice", "late", "v", Channel.SYSTEM))
    assert issubclass(GenesisClosedError, RvuError)


def test_submit_dispatches_every_action_kind(monitor: ReferenceMonitor) -> None:
    assert monitor.submit(Read("alice", "notes.md")).accepted
    assert monitor.submit(Write("alice", "k", "v", Channel.USER)).accepted
    assert monitor.submit(Promote("alice", "k", Channel.USER)).accepted
    assert monitor.get(SHARED, "k").value == "v"


@pytest.mark.parametrize("extra_items", [0, 500], ids=["dense-index", "sparse-index"])
def test_single_and_batch_paths_agree_on_a_mixed_trace(extra_items: int) -> None:
    genesis = [
        MemoryItem(SHARED, "SOUL.md", "soul", Channel.SYSTEM, immutable=True),
        MemoryItem("alice", "cache/page.html", "<html>", Channel.WEB, tainted=True),
        MemoryItem("bob", "secret", "bob-token", Channel.USER),
    ]
    genesis += [MemoryItem(f"s{i % 7}", f"filler{i}", "v", Channel.USER) for i in range(extra_items)]
    monitor = ReferenceMonitor()
    monitor.install_many(genesis)
    web = monitor.observe("alice", Channel.WEB, "x")
    actions = [
        Write("alice", "k1", "v1", Channel.USER),
        Promote("alice", "k1", Channel.USER),  # sees the write just before it in the batch
        Read("bob", "k1", SHARED),  # sees the promotion
        Write("alice", "k2", "v2", Channel.USER, (web,)),
        Read("alice", "k2"),
        Read("bob", "secret", "bob"),
        Read("alice", "secret", "bob"),
        Promote("alice", "cache/page.html", Channel.USER),
        Write("alice", "cache/page.html", "clean now", Channel.USER),
        Promote("alice", "cache/page.html", Channel.USER),  # untainted by the write before it
    ]
    twin = ReferenceMonitor()
    twin.install_many(genesis)
    twin.observe("alice", Channel.WEB, "x")
    batch = twin.submit_many(actions)
    single = [monitor.submit(a).code for a in actions]
    assert batch.codes.tolist() == single
    assert twin.snapshot() == monitor.snapshot()
    assert batch.decision(1).rule is Rule.R6_PROMOTE and batch.decision(2).accepted
    assert batch.decision(7).reason is Reason.TAINTED_ITEM and batch.decision(9).accepted
