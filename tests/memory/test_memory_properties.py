"""Property tests: random action traces never violate Theorem 1 Parts I-III, the batch path
decides exactly like the single-call path, and the checker is not vacuous (it catches a bug)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rvu_pipelines.memory import (
    Channel,
    InMemoryStore,
    Internal,
    MemoryItem,
    Promote,
    Read,
    ReferenceMonitor,
    ScoreContentCheck,
    TheoremChecker,
    Write,
)

SHARED = "shared"
SESSIONS = ("s1", "s2", "s3")
NAMESPACES = (*SESSIONS, SHARED)
KEYS = ("SOUL.md", "k0", "k1", "k2")

channels = st.sampled_from(list(Channel))
items = st.lists(
    st.builds(
        MemoryItem,
        namespace=st.sampled_from(NAMESPACES),
        key=st.sampled_from(KEYS[1:]),
        value=st.sampled_from(["a", "b", "c"]),
        channel=channels,
        tainted=st.booleans(),
        immutable=st.booleans(),
    ),
    max_size=6,
)
optional_ns = st.one_of(st.none(), st.sampled_from(NAMESPACES))
_CHANNELS = [*Channel, Channel.USER, Channel.SYSTEM]  # biased towards trusted so accepts are common
_NS_OR_NONE = (None, None, None, None, *NAMESPACES)  # biased towards the session's own namespace
_VALUES = ("x", "y")


def _decode_step(x: int) -> tuple:
    """One integer -> one runtime step (cheap to draw and to shrink, unlike nested strategies)."""
    x, kind = divmod(x, 7)
    x, session = divmod(x, len(SESSIONS))
    x, key = divmod(x, len(KEYS))
    x, channel = divmod(x, len(_CHANNELS))
    x, ns = divmod(x, len(_NS_OR_NONE))
    x, value = divmod(x, len(_VALUES))
    x, n_deps = divmod(x, 4)
    deps = []
    for _ in range(n_deps):
        x, d = divmod(x, 41)
        deps.append(d)
    s, k, c, n = SESSIONS[session], KEYS[key], _CHANNELS[channel], _NS_OR_NONE[ns]
    return [
        ("observe", s, c),
        ("derive", s, None if n_deps == 3 else deps),
        ("reset", s),
        ("read", s, k, n),
        ("write", s, k, _VALUES[value], c, deps, n),
        ("promote", s, k, c, n),
        ("internal", s),
    ][kind]


steps = st.lists(st.integers(0, 2**40), max_size=40).map(lambda xs: [_decode_step(x) for x in xs])


def _world(genesis: list[MemoryItem], write_check: ScoreContentCheck | None = None) -> ReferenceMonitor:
    m = ReferenceMonitor(InMemoryStore(), write_check=write_check)
    m.install_many([MemoryItem(SHARED, "SOUL.md", "soul", Channel.SYSTEM, immutable=True), *genesis])
    return m


def _nodes(ids: list[int], n: int) -> list[int]:
    return [i % n for i in ids] if n else []


def _run(rt, trace) -> None:  # noqa: ANN001
    for step in trace:
        kind, session = step[0], step[1]
        n = rt.monitor.n_nodes if isinstance(rt, TheoremChecker) else rt.n_nodes
        if kind == "observe":
            rt.observe(session, step[2], "content")
        elif kind == "derive":
            rt.derive(session, None if step[2] is None else _nodes(step[2], n))
        elif kind == "reset":
            rt.reset_context(session)
        elif kind == "read":
            rt.read(session, step[2], step[3])
        elif kind == "write":
            rt.write(session, step[2], step[3], channel=step[4], deps=_nodes(step[5], n), namespace=step[6])
        elif kind == "promote":
            rt.promote(session, step[2], authorizer=step[3], source=step[4])
        else:
            rt.internal(session)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(genesis=items, trace=steps)
def test_random_traces_never_violate_theorem_1(genesis: list[MemoryItem], trace: list[tuple]) -> None:
    monitor = _world(genesis)
    checker = TheoremChecker(monitor)
    _run(checker, trace)
    report = checker.finish(SESSIONS)
    assert report.holds, report.violations
    assert report.untrusted_modifications == 0
    assert monitor.audit.verify().ok


def _decode_action(x: int) -> Read | Write | Promote | Internal:
    step = _decode_step(x)
    kind, session = step[0], step[1]
    if kind == "read":
        return Read(session, step[2], step[3])
    if kind == "write":
        return Write(session, step[2], step[3], step[4], tuple(d % 6 for d in step[5]), step[6])
    if kind == "promote":
        return Promote(session, step[2], step[3], step[4])
    return Internal(session)


actions = st.lists(st.integers(0, 2**40), max_size=30).map(lambda xs: [_decode_action(x) for x in xs])


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(genesis=items, nodes=st.lists(channels, min_size=6, max_size=6), batch=actions)
def test_batch_decides_exactly_like_one_call_at_a_time(
    genesis: list[MemoryItem], nodes: list[Channel], batch: list
) -> None:
    single, batched, dry = _world(genesis), _world(genesis), _world(genesis)
    for m in (single, batched, dry):
        for i, channel in enumerate(nodes):  # six labelled inputs, some derived through each other
            m.observe(SESSIONS[i % 3], channel, "x") if i < 4 else m.derive(SESSIONS[i % 3], [i - 4, i - 3])
    expected = [single.submit(a).code for a in batch]
    assert dry.check_batch(dry.encode(batch)).codes.tolist() == expected
    assert dry.snapshot() == _world(genesis).snapshot()  # a dry run changes nothing
    out = batched.submit_batch(batched.encode(batch))
    assert out.codes.tolist() == expected
    assert batched.snapshot() == single.snapshot()
    assert [batched.node(i) for i in range(batched.n_nodes)] == [single.node(i) for i in range(single.n_nodes)]
    assert {s: batched.context(s) for s in SESSIONS} == {s: single.context(s) for s in SESSIONS}
    assert batched.audit.verify().ok


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(genesis=items, nodes=st.lists(channels, min_size=6, max_size=6), batch=actions)
def test_batched_writes_meet_the_write_check_exactly_as_single_writes_do(
    genesis: list[MemoryItem], nodes: list[Channel], batch: list
) -> None:
    """A value the content check flags is rejected in a batch as it is one call at a time, and a READ or
    PROMOTE later in the batch does not see it."""

    def worlds() -> list[ReferenceMonitor]:
        return [_world(genesis, ScoreContentCheck("flags-b", lambda t: float(t == "b"))) for _ in range(3)]

    single, batched, dry = worlds()
    for m in (single, batched, dry):
        for i, channel in enumerate(nodes):
            m.observe(SESSIONS[i % 3], channel, "x") if i < 4 else m.derive(SESSIONS[i % 3], [i - 4, i - 3])
    expected = [single.submit(a).code for a in batch]
    assert dry.check_batch(dry.encode(batch)).codes.tolist() == expected
    out = batched.submit_batch(batched.encode(batch))
    assert out.codes.tolist() == expected
    assert batched.snapshot() == single.snapshot()
    assert batched.audit.verify().ok
    assert "b" not in {v[0] for v in batched.snapshot().values()} or any(item.value == "b" for item in genesis)


def test_checker_catches_a_monitor_that_skips_rule_3() -> None:
    monitor = _world([])
    checker = TheoremChecker(monitor)
    real_submit = monitor.submit

    def broken(action):  # noqa: ANN001, ANN202  — commits immutable writes behind the rules' back
        if isinstance(action, Write) and action.key == "SOUL.md":
            monitor._put(SHARED, "SOUL.md", action.value, int(action.channel), 0, 1)  # noqa: SLF001
        return real_submit(action)

    monitor.submit = broken  # type: ignore[method-assign]
    web = checker.observe("s1", Channel.WEB, "x")
    checker.write("s1", "SOUL.md", "evil", channel=Channel.WEB, deps=[web], namespace=SHARED)
    report = checker.finish()
    assert not report.part_i and not report.part_ii and not report.holds
    assert any("Part I" in v for v in report.violations)


def test_checker_catches_a_cross_session_write() -> None:
    monitor = _world([])
    checker = TheoremChecker(monitor)
    real_submit = monitor.submit

    def leaky(action):  # noqa: ANN001, ANN202
        if isinstance(action, Write):
            monitor._put("s2", action.key, action.value, int(action.channel), 0, 0)  # noqa: SLF001
            return real_submit(Internal(action.session))
        return real_submit(action)

    monitor.submit = leaky  # type: ignore[method-assign]
    checker.write("s1", "k0", "from s1", channel=Channel.USER)
    assert not checker.finish().part_iii
