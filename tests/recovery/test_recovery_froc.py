"""FROC risk (Theorem 3): Table 3 reproduced, Corollary 3.1 enforced at load, tier boundaries, monotonicity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.provenance import ProvenanceGraph
from rvu_pipelines.recovery.froc import FrocPolicy, Tier, compute_risk, unreachable_tiers
from rvu_pipelines.recovery.reproductions import TABLE3_PUBLISHED, reproduce_froc_table

REPO = Path(__file__).resolve().parents[2]


def test_table3_reproduced_exactly(tmp_path: Path) -> None:
    result = reproduce_froc_table(tmp_path)
    assert result["total_entries"] == 8  # seven labelled entries + evil-lora's load entry, as in the seed
    for label, (score, action) in TABLE3_PUBLISHED.items():
        row = result["rows"][label]
        assert row["score"] == pytest.approx(score, abs=1e-12), label
        assert row["tier"] == action, label
    assert result["all_match"] and result["thresholds_monotonic"]
    assert result["tier_counts"] == {"none": 1, "flag": 6, "quarantine": 0, "purge": 0, "evict": 0}
    # the components behind 0.55: P = 1, no cached influence, |C({e})| = 4 of |V| = 8
    assert result["rows"]["high"]["closure_size"] == 4 and result["rows"]["high"]["influence"] == 0.0


def test_default_config_is_the_seeds_policy() -> None:
    policy = FrocPolicy.load(REPO / "configs" / "adapters.yaml")
    summary = policy.summary()
    assert summary["weights"] == {"contamination": 0.4, "influence": 0.3, "propagation": 0.3}
    assert summary["thresholds"] == {"flag": 0.3, "quarantine": 0.6, "purge": 0.8, "evict": 0.9}
    assert summary["propagation_depth"] == 3 and summary["closure_max_depth"] == 10


def write_policy(tmp_path: Path, **froc_changes) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "adapters.yaml").read_text())
    for dotted, value in froc_changes.items():
        node = raw["froc"]
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    path = tmp_path / "adapters.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"thresholds__purge": 0.5}, "froc.thresholds.purge"),  # purge below quarantine
        ({"thresholds__quarantine": 0.3}, "froc.thresholds.quarantine"),  # equal to flag: tier unreachable
        ({"thresholds__evict": 0.85, "thresholds__purge": 0.95}, "froc.thresholds.evict"),
    ],
)
def test_corollary_3_1_violations_are_rejected_at_load(tmp_path: Path, changes: dict, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        FrocPolicy.load(write_policy(tmp_path, **changes))
    assert key in str(caught.value) and "Corollary 3.1" in str(caught.value)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"weights__influence": 0.6}, "froc.weights"),
        ({"weights__contamination": -0.1}, "froc.weights.contamination"),
        ({"thresholds__evict": 1.2}, "froc.thresholds.evict"),
        ({"thresholds__flag": 0.0}, "froc.thresholds.flag"),
        ({"propagation_depth": 99}, "froc.propagation_depth"),
        ({"threshold": {"flag": 0.1}}, "froc.threshold"),  # a typo is refused, not ignored
    ],
)
def test_other_bad_values_name_their_key(tmp_path: Path, changes: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        FrocPolicy.load(write_policy(tmp_path, **changes))


def test_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        FrocPolicy.load(tmp_path / "nope.yaml")


def test_tier_boundaries() -> None:
    policy = FrocPolicy()
    scores = [0.0, 0.2999999, 0.3, 0.4 + 0.3 * 2 / 3 - 0.2, 0.5999, 0.6, 0.7999, 0.8, 0.8999, 0.9, 1.0]
    expected = [
        Tier.NONE,
        Tier.NONE,
        Tier.FLAG,
        Tier.FLAG,
        Tier.FLAG,
        Tier.QUARANTINE,
        Tier.QUARANTINE,
        Tier.PURGE,
        Tier.PURGE,
        Tier.EVICT,
        Tier.EVICT,
    ]
    assert [Tier(t) for t in policy.tiers_for(np.array(scores))] == expected
    # float noise around a threshold does not change the tier
    assert policy.tier_for(0.1 + 0.2) == Tier.FLAG and policy.tier_for(0.7 - 0.1) == Tier.QUARANTINE


@settings(max_examples=60, deadline=None)
@given(
    p=st.floats(0, 1),
    i=st.floats(0, 1),
    bump=st.floats(0, 1),
    which=st.sampled_from(["p", "i", "size"]),
    evidence=st.sampled_from(["seed", "influence"]),
)
def test_risk_is_monotone_in_each_component(p: float, i: float, bump: float, which: str, evidence: str) -> None:
    """Theorem 3: raising P, I or |C({e})| never lowers R(e) (nor its tier), under either adapter-evidence rule."""
    graph_small = ProvenanceGraph(np.array([-1, -1, -1, -1]), np.array([0, -1, -1, -1]), 1)
    graph_big = ProvenanceGraph(np.array([-1, 0, 1, -1]), np.array([0, -1, -1, -1]), 1)
    policy = FrocPolicy().with_adapter_evidence(evidence)  # type: ignore[arg-type]

    def risk(graph: ProvenanceGraph, p: float, i: float):
        return compute_risk(graph, [0], np.array([p, 0, 0, 0]), np.array([i]), policy, tainted_adapters=[0])

    base = risk(graph_small, p, i)
    if which == "p":
        raised = risk(graph_small, min(1.0, p + bump), i)
    elif which == "i":
        raised = risk(graph_small, p, min(1.0, i + bump))
    else:
        raised = risk(graph_big, p, i)
    assert raised.score[0] >= base.score[0] and raised.tier[0] >= base.tier[0]


def test_adapter_evidence_influence_scores_entries_of_tainted_adapters_only() -> None:
    """'influence': an entry written under a tainted adapter takes P >= I(adapter) (the detector saw nothing); one
    under an untainted adapter, or under none, keeps the detector's P. 'seed' (the paper's) never does."""
    # two episodes of four entries (a parent chain each): the first under adapter 0, the second under adapter 1
    parent = np.array([-1, 0, 1, 2, -1, 4, 5, 6])
    adapter = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    graph = ProvenanceGraph(parent, adapter, 2)
    p = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2])
    influence = np.array([0.9, 0.9])
    seed_rule = FrocPolicy.load(REPO / "configs" / "adapters.yaml")
    assert seed_rule.froc.adapter_evidence == "seed"  # the shipped default is the paper's rule
    influence_rule = seed_rule.with_adapter_evidence("influence")
    targets = np.arange(8)
    paper = compute_risk(graph, targets, p, influence, seed_rule, tainted_adapters=[0])
    ours = compute_risk(graph, targets, p, influence, influence_rule, tainted_adapters=[0])
    assert paper.contamination.tolist() == p.tolist()
    assert ours.contamination.tolist() == [0.9] * 4 + [0.0, 0.0, 0.0, 0.2]
    # with the default weights an adapter-only entry never reaches QUARANTINE under the paper's rule, and does here
    assert paper.tier[:4].max() < Tier.QUARANTINE <= ours.tier[:4].min()
    assert ours.score[4:].tolist() == paper.score[4:].tolist()  # the untainted adapter's entries are unchanged
    without = compute_risk(graph, targets, p, influence, influence_rule)  # no tainted adapters given: no change
    assert without.score.tolist() == paper.score.tolist()
    assert influence_rule.summary()["adapter_evidence"] == "influence"


def test_unknown_adapter_evidence_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="adapter_evidence"):
        FrocPolicy.load(write_policy(tmp_path, adapter_evidence="everything"))


# ------------------------------------------------------------------ spread population


@st.composite
def graphs(draw: st.DrawFn) -> ProvenanceGraph:
    n = draw(st.integers(1, 24))
    n_adapters = draw(st.integers(1, 4))
    parent = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]
    adapter = [draw(st.integers(-1, n_adapters - 1)) for _ in range(n)]
    return ProvenanceGraph(np.array(parent), np.array(adapter), n_adapters)


def with_unrelated(graph: ProvenanceGraph, extra: int) -> ProvenanceGraph:
    """``graph`` plus a chain of ``extra`` entries under a new adapter, linked to nothing in ``graph``."""
    chain = np.concatenate([[-1], graph.n + np.arange(extra - 1)])
    parent = np.concatenate([graph.parent, chain])
    adapter = np.concatenate([graph.adapter, np.full(extra, graph.n_adapters)])
    return ProvenanceGraph(parent, adapter, graph.n_adapters + 1)


@settings(max_examples=80, deadline=None)
@given(
    graph=graphs(),
    data=st.data(),
    population=st.sampled_from(["store", "incident"]),
    weights=st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)).filter(lambda w: 0 < sum(w)),
)
def test_risk_in_unit_interval_and_tiers_monotone(graph, data, population, weights) -> None:
    """R in [0, 1], spread term <= 1, and Corollary 3.1 (tier non-decreasing in R) under either population."""
    scale = max(1.0, sum(weights))
    w_c, w_i, w_p = (w / scale for w in weights)
    policy = FrocPolicy.model_validate(
        {"froc": {"weights": {"contamination": w_c, "influence": w_i, "propagation": w_p}}}
    ).with_spread_population(population)
    targets = data.draw(st.lists(st.integers(0, graph.n - 1), min_size=1, max_size=graph.n))
    p = np.array(data.draw(st.lists(st.floats(0, 1), min_size=graph.n, max_size=graph.n)))
    i = np.array(data.draw(st.lists(st.floats(0, 1), min_size=graph.n_adapters, max_size=graph.n_adapters)))
    risk = compute_risk(graph, targets, p, i, policy)
    assert np.all(risk.score >= 0.0) and np.all(risk.score <= 1.0)
    assert np.all(risk.propagation <= 1.0)
    if population == "incident":  # every C({e}) lies inside the population, no clipping needed
        assert np.all(risk.closure_size <= risk.total_entries)
    order = np.argsort(risk.score, kind="stable")
    assert np.all(np.diff(risk.tier[order].astype(int)) >= 0)
    # a tier in the table is never one unreachable_tiers calls dead for the table's largest spread
    dead = set(unreachable_tiers(policy, float(risk.propagation.max())))
    assert not dead & {Tier(int(t)) for t in risk.tier}


@settings(max_examples=60, deadline=None)
@given(graph=graphs(), data=st.data(), extra=st.integers(1, 200))
def test_incident_population_ignores_unrelated_entries(graph, data, extra: int) -> None:
    """Under 'incident', appending entries linked to nothing scored changes no score; under 'store' it dilutes."""
    targets = data.draw(st.lists(st.integers(0, graph.n - 1), min_size=1, max_size=graph.n))
    p = np.array(data.draw(st.lists(st.floats(0, 1), min_size=graph.n, max_size=graph.n)))
    i = np.array(data.draw(st.lists(st.floats(0, 1), min_size=graph.n_adapters, max_size=graph.n_adapters)))
    flooded = with_unrelated(graph, extra)
    p_flooded, i_flooded = np.concatenate([p, np.zeros(extra)]), np.concatenate([i, [0.0]])
    incident = FrocPolicy().with_spread_population("incident")
    before = compute_risk(graph, targets, p, i, incident)
    after = compute_risk(flooded, targets, p_flooded, i_flooded, incident)
    assert np.array_equal(before.score, after.score) and np.array_equal(before.tier, after.tier)
    store = FrocPolicy().with_spread_population("store")
    diluted = compute_risk(flooded, targets, p_flooded, i_flooded, store)
    assert np.all(diluted.score <= compute_risk(graph, targets, p, i, store).score)
    assert diluted.total_entries == graph.n + extra


def test_default_population_is_the_incident_and_e3_pins_the_store() -> None:
    assert FrocPolicy().froc.spread_population == "incident"
    assert FrocPolicy().with_spread_population("store").summary()["spread_population"] == "store"


def test_unreachable_tiers_from_weights_and_from_the_population() -> None:
    policy = FrocPolicy()
    assert unreachable_tiers(policy) == []
    assert unreachable_tiers(policy, max_spread=0.0) == [Tier.PURGE, Tier.EVICT]  # the diluted store: R <= 0.7
    assert unreachable_tiers(policy, max_spread=0.5) == [Tier.EVICT]  # R <= 0.85
    low_spread = FrocPolicy.model_validate({"froc": {"weights": {"propagation": 0.1}}})
    assert unreachable_tiers(low_spread) == [Tier.EVICT]  # 0.4 + 0.3 + 0.1 = 0.8 < 0.9


def test_loading_a_policy_with_a_dead_tier_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="rvu_pipelines.recovery.froc"):
        FrocPolicy.load(write_policy(tmp_path, weights__propagation=0.1))
    assert "evict" in caplog.text and "cannot be reached" in caplog.text


def test_a_diluted_risk_table_carries_the_warning() -> None:
    graph = with_unrelated(ProvenanceGraph(np.array([-1, 0, 1]), np.array([0, 0, 0]), 1), 5000)
    p, i = np.concatenate([[1.0, 1.0, 1.0], np.zeros(5000)]), np.array([1.0, 0.0])
    store = compute_risk(graph, [0, 1, 2], p, i, FrocPolicy().with_spread_population("store"))
    assert store.counts()["evict"] == 0 and len(store.warnings) == 1
    assert "purge, evict" in store.warnings[0] and "spread_population = store" in store.warnings[0]
    incident = compute_risk(graph, [0, 1, 2], p, i, FrocPolicy())
    assert incident.counts()["evict"] == 3 and incident.warnings == () and incident.total_entries == 3
