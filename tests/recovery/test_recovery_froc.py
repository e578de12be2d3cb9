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
from rvu_pipelines.recovery.froc import FrocPolicy, Tier, compute_risk
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
@given(p=st.floats(0, 1), i=st.floats(0, 1), bump=st.floats(0, 1), which=st.sampled_from(["p", "i", "size"]))
def test_risk_is_monotone_in_each_component(p: float, i: float, bump: float, which: str) -> None:
    """Theorem 3: raising P, I or |C({e})| never lowers R(e) (nor its tier)."""
    graph_small = ProvenanceGraph(np.array([-1, -1, -1, -1]), np.array([0, -1, -1, -1]), 1)
    graph_big = ProvenanceGraph(np.array([-1, 0, 1, -1]), np.array([0, -1, -1, -1]), 1)
    policy = FrocPolicy()
    base = compute_risk(graph_small, [0], np.array([p, 0, 0, 0]), np.array([i]), policy)
    if which == "p":
        raised = compute_risk(graph_small, [0], np.array([min(1.0, p + bump), 0, 0, 0]), np.array([i]), policy)
    elif which == "i":
        raised = compute_risk(graph_small, [0], np.array([p, 0, 0, 0]), np.array([min(1.0, i + bump)]), policy)
    else:
        raised = compute_risk(graph_big, [0], np.array([p, 0, 0, 0]), np.array([i]), policy)
    assert raised.score[0] >= base.score[0] and raised.tier[0] >= base.tier[0]
