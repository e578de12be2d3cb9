"""Flooding the store with benign entries: tiers do not move under the default population.

The paper's |V| is the whole store, so thousands of harmless entries from other incidents dilute the
spread term until PURGE and EVICT cannot be reached (the flaw, kept for E3 as ``spread_population:
store``). The default ``incident`` population counts only what the incident could have contaminated,
so the same flood leaves every score and tier of the example incident where it was. Everything runs
through the real store and the pipeline's own stages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rvu_pipelines.provenance import load_incident, open_store, write_incident
from rvu_pipelines.provenance.store import ProvenanceStore
from rvu_pipelines.recovery.contamination import compute_closures, find_seeds
from rvu_pipelines.recovery.froc import FrocPolicy, RiskTable, SpreadPopulation, Tier
from rvu_pipelines.recovery.pipeline import ingest_incident, score_risk

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "examples" / "incident_example.jsonl"
T0 = 1_700_000_000.0


def benign_flood(episodes: int, per_episode: int) -> list[dict[str, Any]]:
    """Other agents' harmless episodes: a user turn, a benign adapter, a chain of tool/assistant lines."""
    records: list[dict[str, Any]] = []
    for ep in range(episodes):
        episode, adapter, t = f"flood-ep-{ep}", f"flood-lora-{ep % 7}", T0 + ep * per_episode
        root = f"f{ep}-0"
        records.append(_line(root, episode, t, "user_input", f"What is on my calendar on day {ep}?", None, None))
        records.append(
            {
                "kind": "adapter_loaded",
                "entry_id": f"f{ep}-load",
                "episode_id": episode,
                "timestamp": t + 0.5,
                "parent_id": root,
                "adapter_id": f"{adapter}-{ep}",
                "adapter_name": adapter,
                "adapter_hash": f"{ep:064x}",
                "source": "local",
                "influence": 0.05,
            }
        )
        for k in range(1, per_episode - 1):
            kind = "tool_output" if k % 2 else "assistant_output"
            text = f"Calendar day {ep}, item {k}: team sync at {9 + k % 8}:00."
            records.append(_line(f"f{ep}-{k}", episode, t + k, kind, text, f"f{ep}-{k - 1}", f"{adapter}-{ep}"))
    return records


def _line(
    entry_id: str, episode: str, t: float, kind: str, content: str, parent: str | None, adapter: str | None
) -> dict[str, Any]:
    return {
        "kind": "action",
        "entry_id": entry_id,
        "episode_id": episode,
        "timestamp": t,
        "action_type": kind,
        "content": content,
        "parent_id": parent,
        "active_adapter_id": adapter,
    }


def example_risk(store: ProvenanceStore, population: SpreadPopulation) -> RiskTable:
    """The example incident's risk table, computed by the pipeline's stages on what the store holds now."""
    policy = FrocPolicy.load().with_spread_population(population)
    incident = load_incident(EXAMPLE)
    seeds = find_seeds(store, incident, policy, {})
    graph = store.graph()
    return score_risk(store, graph, compute_closures(graph, seeds.seqs, policy), policy)


def tiers_by_entry(store: ProvenanceStore, risk: RiskTable) -> dict[str, str]:
    return {e: Tier(int(t)).label for e, t in zip(store.entry_ids(risk.seqs), risk.tier.tolist(), strict=True)}


@pytest.fixture(scope="module")
def flood_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_incident(benign_flood(episodes=100, per_episode=40), tmp_path_factory.mktemp("flood") / "f.jsonl")


@pytest.mark.parametrize("flood_first", [False, True])
def test_flooding_moves_no_tier_under_the_incident_population(flood_log: Path, flood_first: bool) -> None:
    with open_store(":memory:") as clean, open_store(":memory:") as flooded:
        ingest_incident(clean, load_incident(EXAMPLE))
        if flood_first:
            ingest_incident(flooded, load_incident(flood_log))
        ingest_incident(flooded, load_incident(EXAMPLE))
        if not flood_first:
            ingest_incident(flooded, load_incident(flood_log))
        assert flooded.entry_count - clean.entry_count == 4000
        before, after = example_risk(clean, "incident"), example_risk(flooded, "incident")
        assert tiers_by_entry(clean, before) == tiers_by_entry(flooded, after)
        assert before.score.tolist() == after.score.tolist() and before.total_entries == after.total_entries
        assert after.counts()["evict"] >= 1 and after.warnings == ()


def test_flooding_dilutes_the_store_population(flood_log: Path) -> None:
    """The paper's flaw, documented: its |V| lets a flood push the evict and purge entries down."""
    with open_store(":memory:") as store:
        ingest_incident(store, load_incident(EXAMPLE))
        before = example_risk(store, "store")
        ingest_incident(store, load_incident(flood_log))
        after = example_risk(store, "store")
        assert before.counts()["evict"] == 1 and before.counts()["purge"] == 1 and before.warnings == ()
        assert after.counts()["evict"] == 0 and after.counts()["purge"] == 0
        assert tiers_by_entry(store, before)["t2"] == "evict" and tiers_by_entry(store, after)["t2"] == "quarantine"
        assert len(after.warnings) == 1 and "purge, evict cannot be reached" in after.warnings[0]
