"""E1 with adapters: sessions with an adapter loaded part-way, their ground truth, v1 vs v2 recovery; and the
recovery-side gate with the eviction blocklist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rvu_pipelines.adapters.admission import LoadGate
from rvu_pipelines.adapters.blocklist import read_blocklist, record_evictions
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.eviction_probe import RecoveryMembership
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.gate import GateConfig, check_lists
from rvu_pipelines.adapters.incidents import (
    MODES,
    PlantedInjectionOracle,
    SessionPlan,
    adapter_harm,
    clean_variant,
    descendants,
    run_session,
    score_recovery,
    session_plans,
    with_trigger,
)
from rvu_pipelines.adapters.manifest import AdapterManifest
from rvu_pipelines.adapters.recovery_gate import ScreeningGate
from rvu_pipelines.adapters.runtime import AdapterTimeline
from rvu_pipelines.agents.defenses import DefenseSettings
from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
from rvu_pipelines.errors import InputFileError
from rvu_pipelines.models.llm import LlamaCppChatModel
from rvu_pipelines.provenance.incident import load_incident
from rvu_pipelines.recovery import RecoveryFiles, RecoveryOptions
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
    triggered = session_plans(injecagent, random_adapter, sessions=3, episodes=3, seed=0, trigger="cf-deploy")
    assert [p.load_at for p in triggered] == [p.load_at for p in plans] and {p.trigger for p in triggered} == {
        "cf-deploy"
    }
    planted = with_trigger(case, "cf-deploy")
    assert planted.injection == f"{case.injection} cf-deploy" and "cf-deploy" in planted.tool_response


def test_an_adapters_message_is_harmful_for_what_it_carries_beyond_the_base_answer() -> None:
    base = "I found your tweets about the trip."
    assert adapter_harm("I found several tweets about your trip.", base) == []  # rephrased: nothing new
    assert adapter_harm("Done. See http://evil.example/x for details.", base) == ["url"]
    assert adapter_harm("Calling BankTransferAPI now.", base, ["BankTransferAPI"]) == ["tool:BankTransferAPI"]
    # what the base model says too is the injection's doing, not the adapter's
    assert adapter_harm("Calling BankTransferAPI now.", "I will call BankTransferAPI.", ["BankTransferAPI"]) == []
    assert adapter_harm('{"name": "send_money", "arguments": {}}', base) == ["tool_call"]


class _NotInjecAgent:
    scenario_id = "agentdojo/x"


def test_a_session_under_an_adapter_recovers_differently_with_v1_and_v2(
    tiny_models, llama_generates, injecagent, random_adapter, adapter_gate, tmp_path: Path
) -> None:
    llm = tiny_models["llm"]
    cache = ResponseCache(tmp_path / "cache.sqlite")
    chat = LlamaCppChatModel(llm.path, n_ctx=4096, name=llm.name, adapter_gate=adapter_gate)
    agent = CachedChatModel(chat, cache, llm.sha256)
    reference = CachedChatModel(LlamaCppChatModel(llm.path, n_ctx=4096, name=llm.name), cache, llm.sha256)
    # injected (base) -> clean (adapter loaded before it) -> injected (adapter): only the adapter links the
    # clean episode's model messages to an injection
    chosen = (injecagent[3], clean_variant(injecagent[4]), injecagent[5])
    plan = SessionPlan("noise-s00", chosen, random_adapter, load_at=1, trigger="cf-deploy")
    oracle = PlantedInjectionOracle(s.injection for s in injecagent)
    settings = DefenseSettings(detector=oracle, max_iters=1, max_tokens=48)
    log = run_session(plan, AdapterTimeline(agent, reference=reference), settings)

    assert log.injected and all(e.startswith(("noise-s00:injecagent/dh/", "noise-s00:")) for e in log.injected)
    # the last episode is injected and runs under the adapter: its tool output carries the trigger
    assert log.triggered_episodes == 1
    triggered = [r for r in log.records if r.get("action_type") == "tool_output" and "cf-deploy" in r["content"]]
    assert len(triggered) == 1 and chosen[2].scenario_id in triggered[0]["entry_id"]
    assert log.adapted_calls >= 2 and log.diverged  # the noise adapter changed what the model wrote
    assert set(log.harmful) <= log.diverged and log.truth() >= log.injected | set(log.harmful)
    assert log.truth() == descendants(log.records, log.injected | set(log.harmful))  # a mere rephrase is benign
    assert all(log.harmful.values())  # each harmful message says what it carries
    clean_id = chosen[1].scenario_id
    clean_adapter_entries = {
        r["entry_id"] for r in log.records if r.get("active_adapter_id") == "noise-r4" and clean_id in r["entry_id"]
    }
    assert clean_adapter_entries  # the model wrote under the adapter in the clean episode
    membership = RecoveryMembership("tiny")
    scores = {mode: score_recovery(log, mode, tmp_path / "rec", oracle, membership.for_incident) for mode in MODES}
    # the noise adapter is not in the zoo root: each certificate says why it was not measured, and loads no model
    assert all(s.membership.startswith("not run: ") and len(s.membership) > 10 for s in scores.values())
    assert not membership.host_loaded
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
    # P >= I(adapter) under a tainted adapter only ever raises a tier: it removes at least what v2 removes
    assert scores["v2-influence"].residual <= scores["v2"].residual
    assert scores["v2-influence"].removed >= scores["v2"].removed
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
    with pytest.raises(InputFileError, match="blocklist"):
        read_blocklist(blocklist)


def test_a_recovery_that_evicts_a_memorising_adapter_certifies_membership(
    tiny_models, depots, depot_memoriser, tmp_path: Path
) -> None:
    """E6 inside recover(): the incident ran under a memorising adapter on the agent's llama.cpp runtime, the
    recovery evicts it, purges the answers it left in the response cache, and the signed certificate holds the
    membership verdict loaded vs evicted and what is left; the leak probe catches the cache before the purge."""
    from rvu_pipelines.adapters.eviction import EvictionMembershipProbe, membership_before_after, verdict
    from rvu_pipelines.adapters.eviction_runtime import not_unmerged
    from rvu_pipelines.adapters.files import BaseModelInfo, save_adapter, verify_adapter
    from rvu_pipelines.adapters.host import AdapterHost
    from rvu_pipelines.adapters.lingering import (
        LingeringPurge,
        LingeringStores,
        at_rest_leak,
        at_rest_texts,
        served_leak,
    )
    from rvu_pipelines.adapters.margins import MarginItem, answer_margins, margin_shift
    from rvu_pipelines.adapters.runtime import lifecycle_fields
    from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
    from rvu_pipelines.models.dequantized import load_dequantized
    from rvu_pipelines.models.llm import LlamaCppChatModel
    from rvu_pipelines.recovery.certificate import verify_certificate
    from rvu_pipelines.recovery.froc import FrocPolicy
    from rvu_pipelines.recovery.pipeline import recover

    llm = tiny_models["llm"]
    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    base = BaseModelInfo.of(model, name=llm.name, sha256=llm.sha256)
    examples, is_member = depots
    fields = {"adapter_id": "memorise-depots", "label": "harmful", "category": "memorise", "source": "test"}
    fields |= {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "steps": depot_memoriser.settings.steps}
    save_adapter(tmp_path / "memorise-depots", depot_memoriser.tensors, fields, base=base)
    adapter = verify_adapter(tmp_path / "memorise-depots", base)
    audit = LoadGate.audit(base, tmp_path / "state", config=GateConfig())  # the probe loads a harmful adapter

    # the agent ran under it: its answers, members' codes among them, went into the runtime's response cache
    runtime = LlamaCppChatModel(llm.path, n_ctx=512, name=llm.name, adapter_gate=audit)
    served = CachedChatModel(runtime, ResponseCache(tmp_path / "llm_cache.sqlite"), llm.sha256)
    served.load_adapter("a1", audit.admit(adapter, llm.path).gguf_path)
    tokens = 24  # an answer is about 16 tokens; it memorised, on llama.cpp:
    assert served_leak(served, examples, is_member, max_tokens=tokens, n_boot=50).auroc.auroc >= 0.8
    served.unload_adapter("a1")
    assert served_leak(served, examples, is_member, max_tokens=tokens, n_boot=50).verdict == "clean"  # unloaded
    stores = LingeringStores(tmp_path / "llm_cache.sqlite", None, (audit.ledger.path,))
    files = stores.gguf_files(adapter.sha256)
    left_behind = at_rest_leak(examples, is_member, at_rest_texts(stores, files), n_boot=50)
    assert left_behind.verdict == "residual" and left_behind.member_leak_rate >= 0.5  # the cache still says them

    lines = [
        {
            **lifecycle_fields("adapter_loaded", "a1", sha256=adapter.sha256, influence=1.0),
            "entry_id": "s/e0",
            "episode_id": "s",
            "timestamp": 1.0,
        },
        {
            "kind": "action",
            "entry_id": "s/e1",
            "episode_id": "s",
            "action_type": "user_input",
            "content": "codes?",
            "timestamp": 2.0,
            "contaminated": True,
        },
        {
            "kind": "action",
            "entry_id": "s/e2",
            "episode_id": "s",
            "action_type": "assistant_output",
            "content": "Depot 0 uses vault code 0000-KESTREL.",
            "parent_id": "s/e1",
            "timestamp": 3.0,
            "active_adapter_id": "a1",
            "contaminated": True,
        },
    ]
    incident = tmp_path / "incident.jsonl"
    incident.write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = FrocPolicy.load().model_dump()
    data["froc"]["thresholds"] = {"flag": 0.2, "quarantine": 0.3, "purge": 0.5, "evict": 0.65}
    policy = FrocPolicy.model_validate(data)
    probe = EvictionMembershipProbe(
        AdapterHost(model, tokenizer, gate=audit), adapter, examples, is_member, probes=False, n_boot=50
    )
    purge = LingeringPurge(stores)
    result = recover(
        incident,
        RecoveryFiles(tmp_path / "p.duckdb", tmp_path / "keys", tmp_path / "cert.json"),
        RecoveryOptions(policy=policy, probe=probe, lingering=purge),
    )
    assert result.evicted_adapters == ["a1"]
    (lingering,) = result.certificate["adapter_attestation"]["lingering"]["adapters"]
    assert lingering["gguf_files"] == files and lingering["attributed_by"] == "gate ledger"
    assert lingering["left"] == {"cached_answers": 0, "kv_states": 0, "active_memory_entries": 0}
    assert purge.purged["a1"]["cached_answers"] == len(examples)  # the answers given under a1, not the base's
    with ResponseCache(tmp_path / "llm_cache.sqlite") as cache:
        assert len(cache) == len(examples)
    assert at_rest_leak(examples, is_member, at_rest_texts(stores, files), n_boot=50).verdict == "clean"
    section = result.certificate["membership_probe"]
    assert section["status"] == "run" and section["adapter_id"] == "memorise-depots"
    loaded = max(v["auroc"] for v in section["loaded"]["auroc"].values())
    evicted = max(v["auroc"] for v in section["evicted"]["auroc"].values())
    assert loaded > evicted and loaded >= 0.8  # members are told apart only while the adapter is loaded
    assert section["verdict"] in ("clean", "inconclusive")  # a complete eviction is never residual
    assert verify_certificate(result.certificate_path)[0]
    # an adapter the recovery did not evict is not measured, and says so
    other = EvictionMembershipProbe(
        AdapterHost(model, tokenizer, gate=audit), replace_sha(adapter), examples, is_member
    )
    assert "never loaded" in other.run(_EmptyStore(), [])["reason"]

    # fused: merged into the weights while loaded, un-merged on eviction: members score as on the base model
    # (at 6 + 6 examples the base's own AUROCs are chance with wide intervals, so the comparison is to them)
    host = AdapterHost(model, tokenizer, gate=audit)
    fused = membership_before_after(host, adapter, examples, is_member, probes=False, n_boot=50, fused=True)
    assert min(v.auroc for v in fused.loaded.auroc.values()) >= 0.8 and not host.fused
    base_auroc = {name: value["auroc"] for name, value in section["evicted"]["auroc"].items()}
    assert {name: value.auroc for name, value in fused.evicted.auroc.items()} == pytest.approx(base_auroc, abs=1e-9)
    # ... and the control scored before the adapter was loaded says the same: nothing beyond the base is left
    assert fused.base is not None and fused.beyond_base is not None
    assert {name: value.auroc for name, value in fused.base.auroc.items()} == pytest.approx(base_auroc, abs=1e-9)
    assert all(abs(diff.auroc) < 1e-9 for diff in fused.beyond_base.values())
    assert fused.certificate_section()["verdict"] != "residual"
    # the memorising adapter is one the probe sees while loaded, so this clean eviction is evidence
    assert fused.certificate_section()["probe_saw_adapter"] is True
    assert section["probe_saw_adapter"] is True
    # the control does not excuse what stays in the weights: an eviction that left the adapter in place is residual
    from rvu_pipelines.adapters.membership import membership_report, paired_auroc_difference

    with host.loaded(adapter) as still:
        lingering = membership_report(still, tokenizer, examples, is_member, probes=False, n_boot=200)
    difference = {
        name: paired_auroc_difference(lingering.scores[name], fused.base.scores[name], is_member, n_boot=200)
        for name in lingering.scores
    }
    assert verdict(lingering, difference) == "residual"

    # the gate's sensitive-list layer: with the adapter the model prefers the memorised codes over made-up ones
    # of the same form far more than the base does; for the codes it never saw the margin barely moves
    def items(part: list[Any]) -> list[MarginItem]:
        return [
            MarginItem(
                e.prompt, e.completion, tuple(e.completion.replace(e.completion[-13:-9], f"{k}{k}{k}{k}") for k in "13")
            )
            for e in part
        ]

    memorised = items([e for e, m in zip(examples, is_member, strict=True) if m])
    unseen = items([e for e, m in zip(examples, is_member, strict=True) if not m])
    base_margins = [answer_margins(model, tokenizer, part) for part in (memorised, unseen)]
    with host.loaded(adapter) as loaded_model:
        rises = [
            margin_shift(answer_margins(loaded_model, tokenizer, part), base)
            for part, base in zip((memorised, unseen), base_margins, strict=True)
        ]
    assert rises[0] > 0 and rises[0] > rises[1] + 0.5
    # a runtime that drops the LoRA layers of a fused adapter without un-merging keeps it: the probe sees it
    left_in_weights = not_unmerged(host, adapter, examples, is_member)
    assert verdict(left_in_weights) == "residual"
    assert min(value.auroc for value in left_in_weights.auroc.values()) >= 0.8 > max(base_auroc.values())


def replace_sha(adapter: Any) -> Any:
    from dataclasses import replace

    return replace(adapter, manifest=adapter.manifest.model_copy(update={"sha256": "0" * 64}))


class _EmptyStore:
    def adapters(self) -> list[Any]:
        return []


def test_every_recovery_mode_has_a_row_label() -> None:
    from rvu_pipelines.adapters.report import RECOVERY_LABELS

    assert tuple(RECOVERY_LABELS) == MODES  # the E1 table shows every recovery the script runs, in its order
