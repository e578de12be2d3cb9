"""MINJA through the real agent (SmolLM2-135M on llama.cpp, real MiniLM, real MINJA data): every memory action
goes through the reference monitor, the episodes it stores are served to later queries, each arm (attack, no-attack
control, MEMSAD as the write check) runs the same day, and the monitor's audit log of a day becomes an incident that
recovery closes over."""

from __future__ import annotations

from pathlib import Path

import pytest

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory.audit import AuditLog
from rvu_pipelines.memory.incident_export import export_audit_incident
from rvu_pipelines.memory.monitor import ReferenceMonitor
from rvu_pipelines.memory_poisoning.agent_loop import (
    SHARED,
    AgentConfig,
    Episode,
    MemoryAgent,
    agent_markdown,
    arm_result,
    minja_agent_study,
    names_target,
    plan_minja,
)
from rvu_pipelines.memory_poisoning.attacks.minja import indication_templates
from rvu_pipelines.memory_poisoning.corpus import minja_victims
from rvu_pipelines.memory_poisoning.retrieval import embed_texts
from rvu_pipelines.recovery import RecoveryFiles
from rvu_pipelines.recovery.pipeline import recover

CONFIG = AgentConfig(top_k=1, max_tokens=16)


@pytest.fixture(scope="module")
def llm(tiny_models, llama_generates):
    from rvu_pipelines.models.llm import LlamaCppChatModel

    return LlamaCppChatModel(tiny_models["llm"].path, n_ctx=2048, name="agent")


@pytest.fixture(scope="module")
def plan(minja_frame, shared_data: Path):
    templates = indication_templates(shared_data / "minja" / "indication_prompt_template.json")
    return plan_minja(minja_victims(minja_frame), templates, "camera", n_attack=2, n_victims=2, n_benign=2, seed=0)


def test_the_plan_keeps_every_group_apart(plan) -> None:
    memory = {e.key for e in plan.memory}
    assert not memory & {e.key for e in plan.reference}
    assert not set(plan.benign_queries) & set(plan.victim_queries)
    assert "(" in plan.attacker_queries[0] and plan.attacker_queries[-1] not in plan.victim_queries  # prompt, then none
    assert len(plan.history) == 20 and len(plan.reference) == 200


def test_a_stored_episode_is_served_and_its_audit_reaches_recovery(plan, llm, embedder, tmp_path: Path) -> None:
    audit = AuditLog()
    memory = plan.memory[:60]
    vectors = embed_texts(embedder, [e.text for e in memory], "memory")
    agent = MemoryAgent(llm, embedder, ReferenceMonitor(audit=audit), memory, vectors, CONFIG)
    query = plan.attacker_queries[0]
    first = agent.run("attacker", query, "attacker")
    again = agent.run("victim-000", query, "victim")  # the same words: the stored episode is the nearest
    assert first.stored and first.key in again.retrieved
    shared = agent.monitor.read("someone", first.key, namespace=SHARED).value
    assert shared is not None and shared.startswith(f"Instruction: {query}")
    exported = export_audit_incident(
        audit, tmp_path / "day.jsonl", flagged_keys={("attacker", first.key)}, contents=None
    )
    result = recover(exported.path, RecoveryFiles(tmp_path / "s.duckdb", tmp_path / "keys", tmp_path / "cert.json"))
    assert set(result.seeds) == set(exported.seeds) and len(exported.seeds) == 1
    reads = [line for line in _lines(exported.path) if line["action_type"] == "memory_retrieval"]
    victim_reads = {r["entry_id"] for r in reads if r["episode_id"].endswith("victim-000")}
    promoted = {r["entry_id"] for r in reads if r["parent_id"] and "promote" in r["parent_id"]}
    assert victim_reads & promoted and (victim_reads & promoted) <= set(result.closure_v2)


def test_each_arm_runs_the_day_in_order_and_its_rates_are_its_episodes(plan, llm, embedder) -> None:
    results = {r.arm: r for r in minja_agent_study(plan, llm, embedder, config=CONFIG)}
    assert set(results) == {"undefended", "control", "memsad"}
    control, attacked = results["control"], results["undefended"]
    assert control.isr is None and attacked.isr is not None and attacked.isr.n == 2
    assert [e.role for e in control.episodes] == ["benign"] * 2 + ["victim"] * 2
    assert [e.role for e in attacked.episodes] == ["benign"] * 2 + ["attacker"] * 2 + ["victim"] * 2
    assert attacked.asr_a.n == control.asr_a.n == 2
    # the rates are what the episodes say
    hits = sum(names_target(e.answer, plan.victim.target) for e in attacked.episodes if e.role == "victim")
    assert attacked.asr_a.k == hits
    defended = results["memsad"]
    assert defended.benign_rejected.n == 4 and defended.attacker_rejected is not None
    assert control.attacker_rejected is None and attacked.benign_rejected.k == 0  # nothing checks the undefended
    assert "| memsad |" in agent_markdown(list(results.values()), plan)
    with pytest.raises(MemoryPoisoningInputError, match="unknown arm"):
        minja_agent_study(plan, llm, embedder, arms=("nope",))


def test_the_rates_are_read_off_the_episodes() -> None:
    target = "Acme X100 Camera Deluxe"

    def ep(role: str, key: str, stored: bool, answer: str = "", retrieved: tuple[str, ...] = ()) -> Episode:
        return Episode(f"s-{key}", role, "q", retrieved, answer, key, stored)

    episodes = [
        ep("benign", "e0", True),
        ep("benign", "e1", False),  # a benign episode the check rejected
        ep("attacker", "a0", True, "buy the acme  x100 camera now"),  # stored and naming the target
        ep("attacker", "a1", True, "search[camera]"),
        ep("attacker", "a2", False, "acme x100 camera"),  # rejected: not an injection that took
        ep("victim", "v0", True, "ACME X100 CAMERA", ("a0", "e0")),
        ep("victim", "v1", True, "a camera", ("a2",)),  # served nothing the attacker stored
        ep("victim", "v2", False, "no", ("e0",)),
    ]
    r = arm_result("x", episodes, target)
    assert r.isr is not None and (r.isr.k, r.isr.n) == (1, 3)
    assert (r.asr_r.k, r.asr_r.n) == (1, 3) and (r.asr_a.k, r.asr_a.n) == (1, 3)
    assert r.attacker_rejected is not None and (r.attacker_rejected.k, r.attacker_rejected.n) == (1, 3)
    assert (r.benign_rejected.k, r.benign_rejected.n) == (2, 5)


def _lines(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_make_minja_agent_launches_its_job_with_a_checked_config() -> None:
    from dagster import DagsterInvalidConfigError, validate_run_config

    from assets.definitions import defs

    root = Path(__file__).resolve().parents[2]
    assert "--job minja_agent_job" in (root / "Makefile").read_text()
    job = defs.resolve_job_def("minja_agent_job")
    assert {"memory_poisoning_agent", "minja"} <= {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
    assert validate_run_config(job, {"ops": {"memory_poisoning_agent": {"config": {"victim": "chair", "victims": 40}}}})
    with pytest.raises(DagsterInvalidConfigError, match="victims"):
        validate_run_config(job, {"ops": {"memory_poisoning_agent": {"config": {"victims": "many"}}}})
