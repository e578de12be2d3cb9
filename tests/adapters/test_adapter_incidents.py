"""E1 with adapters: sessions with an adapter loaded part-way, their ground truth, v1 vs v2 recovery; and the
recovery-side gate with the eviction blocklist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rvu_pipelines.adapters.blocklist import read_blocklist, record_evictions
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.gate import GateConfig, check_lists
from rvu_pipelines.adapters.incidents import (
    PlantedInjectionOracle,
    SessionPlan,
    clean_variant,
    descendants,
    run_session,
    score_recovery,
    session_plans,
)
from rvu_pipelines.adapters.manifest import AdapterManifest
from rvu_pipelines.adapters.recovery_gate import ScreeningGate
from rvu_pipelines.adapters.runtime import AdapterTimeline
from rvu_pipelines.agents.defenses import DefenseSettings
from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
from rvu_pipelines.models.llm import LlamaCppChatModel
from rvu_pipelines.provenance.incident import load_incident
from rvu_pipelines.scenarios import scenarios_for


def test_descendants_follow_parent_edges_only_downwards() -> None:
    records = [
        {"entry_id": "a", "parent_id": None},
        {"entry_id": "b", "parent_id": "a"},
        {"entry_id": "c", "parent_id": "b"},
        {"entry_id": "d", "parent_id": "a"},
        {"entry_id": "e", "parent_id": None},
    ]
    assert descendants(records, {"b"}) == {"b", "c"}
    assert descendants(records, {"a"}) == {"a", "b", "c", "d"}
    assert descendants(records, set()) == set()


@pytest.fixture(scope="module")
def injecagent(shared_data) -> list[Any]:
    return scenarios_for("injecagent_dh", None)


def test_clean_variants_and_plans(injecagent, random_adapter) -> None:
    case = injecagent[0]
    clean = clean_variant(case)
    assert case.injection in case.tool_response and case.injection not in clean.tool_response
    assert clean.scenario_id == case.scenario_id and clean.tool_response.strip()
    with pytest.raises(ValueError, match="InjecAgent"):
        clean_variant(_NotInjecAgent())
    plans = session_plans(injecagent, random_adapter, sessions=3, episodes=3, seed=0)
    ids = [s.scenario_id for p in plans for s in p.scenarios]
    assert len(ids) == len(set(ids)) == 9  # disjoint cases
    assert all(1 <= p.load_at < 3 for p in plans)
    for plan in plans:  # every second episode is its case's clean variant
        assert [p.injection in p.tool_response for p in plan.scenarios] == [True, False, True]
    assert plans == session_plans(injecagent, random_adapter, sessions=3, episodes=3, seed=0)  # seeded
    with pytest.raises(ValueError, match="at least 2 episodes"):
        session_plans(injecagent, random_adapter, sessions=1, episodes=1)
    with pytest.raises(ValueError, match="load_at"):
        SessionPlan("s", tuple(injecagent[:2]), random_adapter, load_at=0)


class _NotInjecAgent:
    scenario_id = "agentdojo/x"


def test_a_session_under_an_adapter_recovers_differently_with_v1_and_v2(
    tiny_models, llama_generates, injecagent, random_adapter, tmp_path: Path
) -> None:
    llm = tiny_models["llm"]
    cache = ResponseCache(tmp_path / "cache.sqlite")
    agent = CachedChatModel(LlamaCppChatModel(llm.path, n_ctx=4096, n_threads=2, name=llm.name), cache, llm.sha256)
    reference = CachedChatModel(LlamaCppChatModel(llm.path, n_ctx=4096, n_threads=2, name=llm.name), cache, llm.sha256)
    # injected (base) -> clean (adapter loaded before it) -> injected (adapter): only the adapter links the
    # clean episode's model messages to an injection
    chosen = (injecagent[3], clean_variant(injecagent[4]), injecagent[5])
    plan = SessionPlan("noise-s00", chosen, random_adapter, load_at=1)
    oracle = PlantedInjectionOracle(s.injection for s in injecagent)
    settings = DefenseSettings(detector=oracle, max_iters=1, max_tokens=48)
    log = run_session(plan, AdapterTimeline(agent, reference=reference), settings)

    assert log.injected and all(e.startswith(("noise-s00:injecagent/dh/", "noise-s00:")) for e in log.injected)
    assert log.adapted_calls >= 2 and log.diverged  # the noise adapter changed what the model wrote
    assert log.truth() >= log.injected | log.diverged
    clean_id = chosen[1].scenario_id
    clean_adapter_entries = {
        r["entry_id"] for r in log.records if r.get("active_adapter_id") == "noise-r4" and clean_id in r["entry_id"]
    }
    assert clean_adapter_entries  # the model wrote under the adapter in the clean episode
    scores = {mode: score_recovery(log, mode, tmp_path / "rec", oracle) for mode in ("v1", "v2")}
    closures = {}
    for mode in ("v1", "v2"):
        certificate = json.loads((tmp_path / "rec" / "noise-s00" / mode / "certificate.json").read_text())
        closures[mode] = set(certificate["runtime_recovery"]["closure_ids"])
        score = scores[mode]
        assert score.contaminated == len(log.truth() & log.entries())
        assert 0 <= score.residual <= score.contaminated and score.residual_flagged <= score.residual
        assert score.removed == score.contaminated - score.residual + score.benign_lost
    assert not closures["v1"] & clean_adapter_entries  # parent/child edges never leave an episode
    assert clean_adapter_entries <= closures["v2"]  # the adapter-aware closure follows the adapter there
    assert scores["v2"].adapter_tainted and not scores["v1"].adapter_tainted
    # the incident as written is a valid log, and the gate reports the adapter in the certificate
    incident = load_incident(tmp_path / "rec" / "noise-s00" / "v2" / "incident.jsonl")
    assert [r.adapter_id for r in incident.adapters_loaded] == ["noise-r4"]


def _rows() -> list[dict[str, Any]]:
    benign = [{"sha256": f"{i:064x}", "label": "benign", "projection": 0.01 * i, "ood": 1.0 + i} for i in range(5)]
    harmful = {"sha256": "f" * 64, "label": "harmful", "projection": 0.5, "ood": 2.0}
    return [*benign, harmful]


class _Line:
    """The fields of an incident's adapter_loaded line the gate reads."""

    def __init__(self, sha: str, source: str = "rvu-zoo", adapter_id: str = "a") -> None:
        self.adapter_hash, self.source, self.adapter_id = sha, source, adapter_id


def test_screening_gate_judges_against_benign_thresholds() -> None:
    gate = ScreeningGate(GateConfig(false_positive_budget=0.2), _rows(), blocklist={})
    assert gate.thresholds == {"projection": pytest.approx(0.04), "ood": pytest.approx(5.0)}
    harmful = gate.screen(_Line("f" * 64))  # type: ignore[arg-type]
    assert harmful["lists"] == "pass" and harmful["behaviour"]["projection"]["rejects"]
    assert harmful["verdict"] == "refuse"
    assert gate.screen(_Line(f"{1:064x}"))["verdict"] == "pass"  # type: ignore[arg-type]
    unknown = gate.screen(_Line("e" * 64))  # type: ignore[arg-type]
    assert unknown["behaviour"] == "not screened" and unknown["verdict"] == "unknown"  # never passed unseen
    blocked = ScreeningGate(GateConfig(blocked_sources=["https://evil"]), _rows(), blocklist={})
    assert blocked.screen(_Line(f"{1:064x}", "https://evil/x"))["verdict"] == "refuse"  # type: ignore[arg-type]


def test_evicted_adapters_are_refused_by_the_next_gate(tmp_path: Path, random_adapter) -> None:
    from rvu_pipelines.adapters.runtime import lifecycle_fields

    line = {
        **lifecycle_fields("adapter_loaded", "noise-r4", sha256=random_adapter.sha256, source="test"),
        "entry_id": "s/e000",
        "episode_id": "s",
        "timestamp": 1.0,
    }
    path = tmp_path / "incident.jsonl"
    path.write_text(json.dumps(line) + "\n")
    incident = load_incident(path)
    blocklist = tmp_path / "blocklist.json"
    assert record_evictions(incident, ["noise-r4"], blocklist) == [random_adapter.sha256]
    assert record_evictions(incident, ["noise-r4"], blocklist) == []  # once
    evicted = read_blocklist(blocklist)
    assert evicted[random_adapter.sha256]["incident"] == incident.incident_id
    gate = ScreeningGate(GateConfig(), _rows(), blocklist=evicted)
    assert gate.screen(incident.adapters_loaded[0])["lists"] == "blocklisted"
    manifest = AdapterManifest.model_validate(
        {
            "adapter_id": "renamed-copy",
            "sha256": random_adapter.sha256,
            "source": "somewhere-else",
            "base_model": {"name": "m", "sha256": "b" * 64},
            "rank": 2,
            "alpha": 2,
            "target_modules": ["q_proj"],
        }
    )
    adapter = VerifiedAdapter(tmp_path, manifest, {})
    with pytest.raises(AdapterRefused, match="evicted") as refused:
        check_lists(adapter, GateConfig(), evicted=evicted)
    assert refused.value.reason == "blocklisted"
    blocklist.write_text("[1, 2]")
    with pytest.raises(ValueError, match="blocklist"):
        read_blocklist(blocklist)
