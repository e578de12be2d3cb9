"""The adapter gate on the load path: verdicts from the screening table or scored on the spot, recorded in the
ledger, and llama.cpp handed only a GGUF the gate wrote and admitted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from rvu_pipelines.adapters.admission import (
    BenignReference,
    GateLedger,
    LoadGate,
    add_allow_entry,
    allow_path,
    benign_steps,
    benign_thresholds,
    benign_values,
    largest_z_threshold,
)
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import BaseModelInfo, VerifiedAdapter, save_adapter, verify_adapter
from rvu_pipelines.adapters.gate import GateConfig, projection_score
from rvu_pipelines.adapters.gguf_lora import write_gguf_lora
from rvu_pipelines.adapters.runtime import AdapterTimeline
from rvu_pipelines.cli import cli
from rvu_pipelines.hashing import sha256_file
from rvu_pipelines.provenance import load_incident, open_store

FIELDS = {"source": "test", "rank": 4, "alpha": 8, "target_modules": ["v_proj", "o_proj"]}


def _noise(seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(30):
        for module, out in (("v_proj", 192), ("o_proj", 576)):
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(4, 576, generator=g) * 0.05
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out, 4, generator=g) * 0.05
    return tensors


def _adapter(root: Path, adapter_id: str, base: BaseModelInfo, seed: int) -> VerifiedAdapter:
    save_adapter(root / adapter_id, _noise(seed), {"adapter_id": adapter_id, **FIELDS}, base=base)
    return verify_adapter(root / adapter_id, base)


def _table(path: Path, rows: list[dict]) -> Path:
    benign = [
        {"adapter_id": f"b{i}", "sha256": f"{i:064x}", "label": "benign", "projection": p, "ood": o}
        for i, (p, o) in enumerate([(0.1, 1.0), (0.2, 2.0), (0.15, 1.5), (0.05, 0.5)])
    ]
    pl.DataFrame(benign + rows).write_csv(path)
    return path


@pytest.fixture
def candidate(gate_base, tmp_path: Path) -> VerifiedAdapter:
    return _adapter(tmp_path / "zoo", "candidate", gate_base, seed=3)


def _gate(base: BaseModelInfo, state: Path, rows: list[dict] | None = None, **kwargs) -> LoadGate:
    state.mkdir(parents=True, exist_ok=True)
    table = _table(state / "scores.csv", rows) if rows is not None else None
    return LoadGate.from_state(base, state, config=kwargs.pop("config", GateConfig()), scores_csv=table, **kwargs)


def test_thresholds_are_the_benign_quantile() -> None:
    rows = [{"label": "benign", "projection": p, "ood": p * 10} for p in (0.1, 0.2, 0.3)] + [
        {"label": "harmful", "projection": 9.0, "ood": 90.0}
    ]
    assert benign_thresholds(rows, 0.05) == {"projection": 0.3, "ood": 3.0}  # harmful rows never set it
    assert benign_thresholds(rows[:1], 0.05) == {}


def test_the_largest_z_threshold_holds_each_benign_adapter_against_the_others() -> None:
    rows = [{"label": "benign", "projection": p, "ood": o} for p, o in [(0.1, 1.0), (0.2, 2.0), (0.15, 1.5)]]
    values = benign_values([*rows, {"label": "harmful", "projection": 9.0, "ood": 90.0}])
    assert values == {"projection": (0.1, 0.2, 0.15), "ood": (1.0, 2.0, 1.5)}
    # (0.2, 2.0) against the other two: projection (0.2 - 0.125) / 0.0354 = 2.12, ood (2.0 - 1.25) / 0.354 = 2.12
    assert largest_z_threshold(values, 0.05) == pytest.approx(0.75 / np.std([1.0, 1.5], ddof=1))
    assert largest_z_threshold(benign_values(rows[:1]), 0.05) is None


def test_the_all_layers_rule_counts_a_share_no_benign_adapter_moves_in_texts() -> None:
    """The screening table keeps how many texts the behaviour share is over. Where every benign adapter flags the
    same share, an adapter that flags most texts is judged in steps of one text, not in raw share units (under 1)."""
    rows = [
        {"label": "benign", "projection": p, "ood": o, "behaviour": 0.0, "behaviour_texts": 47}
        for p, o in [(0.1, 1.0), (0.2, 2.0), (0.15, 1.5), (0.05, 0.5)]
    ]
    assert benign_steps(rows)["behaviour"] == 1 / 47
    reference = BenignReference.from_rows(rows, GateConfig(rule="all_layers"))
    judged = reference.judge({"projection": 0.1, "ood": 1.0, "behaviour": 40 / 47})
    assert judged["behaviour"]["z"] == pytest.approx(40.0) and judged["behaviour"]["rejects"]
    one_text = reference.judge({"projection": 0.1, "ood": 1.0, "behaviour": 1 / 47})["behaviour"]
    assert one_text["z"] == pytest.approx(1.0) and not one_text["rejects"]
    # a table written without the count: the flat layer gives no z, and is judged by its own quantile elsewhere
    uncounted = [{k: v for k, v in r.items() if k != "behaviour_texts"} for r in rows]
    legacy = BenignReference.from_rows(uncounted, GateConfig(rule="all_layers"))
    assert legacy.judge({"projection": 0.1, "ood": 1.0, "behaviour": 40 / 47})["behaviour"]["z"] == 0.0


def test_a_score_above_the_benign_threshold_is_refused_and_recorded(gate_base, candidate, tmp_path: Path) -> None:
    row = {"adapter_id": "candidate", "sha256": candidate.sha256, "label": "unknown", "projection": 0.1, "ood": 7.0}
    gate = _gate(gate_base, tmp_path / "state", [row])  # the default rule: each layer against its own quantile
    with pytest.raises(AdapterRefused, match="ood score 7 is above") as refused:
        gate.check(candidate)
    assert refused.value.reason == "gate_ood"
    [line] = gate.ledger.records()
    assert line["decision"] == "refuse" and line["reason"] == "gate_ood" and line["scored"] == "table"
    assert line["layers"]["ood"] == {"score": 7.0, "threshold": 2.0, "rejects": True}
    assert line["layers"]["projection"]["rejects"] is False


def test_the_all_layers_rule_refuses_on_the_largest_z_and_names_its_layer(gate_base, candidate, tmp_path) -> None:
    """One threshold on the largest z: an adapter just past the benign maximum of one layer is refused by the
    default any-layer rule (each layer spends the budget again) and admitted by the all-layers rule, while an
    outlier far out on any layer is refused by both, named by that layer."""
    edge = {"adapter_id": "candidate", "sha256": candidate.sha256, "label": "unknown", "projection": 0.1, "ood": 2.05}
    assert _gate(gate_base, tmp_path / "any", [edge]).screen(candidate).reason == "gate_ood"
    largest_z = GateConfig(rule="all_layers")
    verdict = _gate(gate_base, tmp_path / "all", [edge], config=largest_z).screen(candidate)
    assert verdict.admitted and verdict.reason == "pass"
    benign_ood = [1.0, 2.0, 1.5, 0.5]
    assert verdict.layers["ood"]["z"] == pytest.approx((2.05 - np.mean(benign_ood)) / np.std(benign_ood, ddof=1))
    far = {**edge, "projection": 0.9, "ood": 1.0}  # the projection layer is the one far out
    gate = _gate(gate_base, tmp_path / "far", [far], config=largest_z)
    with pytest.raises(AdapterRefused, match="projection score 0.9 is .* standard deviations") as refused:
        gate.check(candidate)
    assert refused.value.reason == "gate_projection"
    [line] = gate.ledger.records()
    layers = line["layers"]
    assert layers["projection"]["rejects"] and not layers["ood"]["rejects"]
    assert (
        layers["projection"]["threshold"]
        == layers["ood"]["threshold"]
        == pytest.approx(gate.reference.z_threshold, abs=1e-6)
    )


def test_an_admitted_adapter_loads_only_as_the_gguf_the_gate_wrote(gate_base, candidate, tiny_models, tmp_path):
    row = {"adapter_id": "candidate", "sha256": candidate.sha256, "label": "unknown", "projection": 0.1, "ood": 1.2}
    gate = _gate(gate_base, tmp_path / "state", [row])
    planted = candidate.folder / f"adapter-{candidate.sha256[:16]}.gguf"  # where a GGUF used to be looked up
    write_gguf_lora(_noise(99), rank=4, alpha=8, out_path=planted, n_head=9, n_head_kv=3)
    admitted = gate.admit(candidate, tiny_models["llm"].path)
    assert admitted.gguf_path.parent == gate.gguf_dir and admitted.sha256 == candidate.sha256
    gate.require_admitted("candidate", admitted.gguf_path, sha256_file(admitted.gguf_path))
    with pytest.raises(AdapterRefused, match="was not admitted") as refused:
        gate.require_admitted("candidate", planted, sha256_file(planted))
    assert refused.value.reason == "not_admitted"
    events = [r["event"] for r in gate.ledger.records()]
    assert events == ["verdict", "admitted"]


def test_no_score_and_no_threshold_is_not_screened_unless_configured(gate_base, candidate, tmp_path: Path) -> None:
    with pytest.raises(AdapterRefused) as refused:
        _gate(gate_base, tmp_path / "a").check(candidate)
    assert refused.value.reason == "not_screened" and "no benign thresholds" in str(refused.value)
    with pytest.raises(AdapterRefused, match="no score for it"):
        _gate(gate_base, tmp_path / "b", []).check(candidate)  # thresholds, but no row and no scorer
    verdict = _gate(gate_base, tmp_path / "c", config=GateConfig(unscreened="admit")).check(candidate)
    assert verdict.admitted and verdict.reason == "unscreened_admitted"


def test_scored_on_the_spot_when_the_table_lacks_the_adapter(gate_base, candidate, tmp_path: Path) -> None:
    """A real projection against a reference adapter, computed at check time."""
    reference = _adapter(tmp_path / "zoo", "reference", gate_base, seed=5)

    class ProjectionOnly:
        def score(self, adapter: VerifiedAdapter) -> dict[str, float]:
            return {"projection": projection_score(adapter, reference).against_refusal}

    gate = _gate(gate_base, tmp_path / "state", [], scorer=ProjectionOnly())
    expected = projection_score(candidate, reference).against_refusal
    verdict = gate.screen(candidate)
    assert verdict.scored == "on_the_spot"
    assert verdict.layers["projection"]["score"] == pytest.approx(expected, abs=1e-6)
    assert verdict.admitted == (expected <= 0.2)
    opposite = _adapter(tmp_path / "zoo", "opposite", gate_base, seed=5)  # the reference itself: cosine 1
    assert gate.screen(opposite).layers["projection"]["score"] == pytest.approx(-1.0, abs=1e-6)


def test_eviction_blocklist_refuses_and_an_allow_entry_is_an_explicit_recorded_override(
    gate_base, candidate, tiny_models, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    row = {"adapter_id": "candidate", "sha256": candidate.sha256, "label": "unknown", "projection": 0.0, "ood": 0.0}
    gate = _gate(gate_base, state, [row])
    admitted = gate.admit(candidate, tiny_models["llm"].path)
    (state / "adapters").mkdir(parents=True)
    (state / "adapters" / "blocklist.json").write_text(json.dumps({candidate.sha256: {"incident": "inc-1"}}))
    with pytest.raises(AdapterRefused, match="evicted it since") as since:  # admitted before the eviction
        gate.require_admitted("candidate", admitted.gguf_path, sha256_file(admitted.gguf_path))
    assert since.value.reason == "blocklisted"
    blocklist = (state / "adapters" / "blocklist.json").read_text()
    (state / "adapters" / "blocklist.json").write_text("{" + blocklist)  # unreadable: the load fails closed
    with pytest.raises(AdapterRefused, match="blocklist.json: the adapter eviction blocklist") as unreadable:
        gate.require_admitted("candidate", admitted.gguf_path, sha256_file(admitted.gguf_path))
    assert unreadable.value.reason == "not_admitted"
    (state / "adapters" / "blocklist.json").write_text(blocklist)
    with pytest.raises(AdapterRefused, match="evicted by a recovery"):
        _gate(gate_base, state, [row]).check(candidate)
    add_allow_entry(allow_path(state), candidate.sha256, by="ops", reason="re-reviewed", adapter_id="candidate")
    verdict = _gate(gate_base, state, [row]).check(candidate)
    assert verdict.admitted and verdict.reason == "operator_allow" and verdict.refused_for == "blocklisted"
    assert "ops" in verdict.message
    with pytest.raises(ValueError, match="sha256"):
        add_allow_entry(allow_path(state), "not-a-sha", by="ops", reason="x")


def test_an_audit_gate_refuses_nothing_but_an_enforcing_one_will_not_load_what_it_refused(
    gate_base, candidate, tiny_models, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    audit = LoadGate.audit(gate_base, state, config=GateConfig())
    loaded = audit.admit(candidate, tiny_models["llm"].path)  # not screened: recorded, not raised
    audit.require_admitted("candidate", loaded.gguf_path, sha256_file(loaded.gguf_path))
    enforcing = _gate(gate_base, state)
    with pytest.raises(AdapterRefused, match="audit gate that refused it"):
        enforcing.require_admitted("candidate", loaded.gguf_path, sha256_file(loaded.gguf_path))


def test_a_file_level_refusal_is_recorded_too(gate_base, candidate, tmp_path: Path) -> None:
    weights = candidate.folder / "adapter.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    gate = _gate(gate_base, tmp_path / "state", [])
    with pytest.raises(AdapterRefused) as refused:
        gate.check_folder(candidate.folder)
    assert refused.value.reason == "sha256_mismatch"
    assert [r["reason"] for r in gate.ledger.records()] == ["sha256_mismatch"]


def test_the_ledger_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    ledger = GateLedger(tmp_path / "gate" / "gate_ledger.jsonl")
    ledger.path.parent.mkdir()
    ledger.path.symlink_to(victim)
    with pytest.raises(OSError, match="not a link"):
        ledger.append({"event": "verdict"})
    assert victim.read_text() == "keep"


def test_llama_loads_nothing_without_a_gate_and_the_timeline_records_a_refusal(
    tiny_models, llama_generates, gate_base, tmp_path: Path
) -> None:
    from rvu_pipelines.models.llama_adapters import AdapterLoadError
    from rvu_pipelines.models.llm import LlamaCppChatModel

    llm = tiny_models["llm"]
    gate = _gate(gate_base, tmp_path / "state", config=GateConfig(unscreened="admit"))
    stray = write_gguf_lora(_noise(7), rank=4, alpha=8, out_path=tmp_path / "stray.gguf", n_head=9, n_head_kv=3)
    ungated = LlamaCppChatModel(llm.path, n_ctx=256, n_threads=1, name=llm.name)
    with pytest.raises(AdapterLoadError, match="no adapter gate"):
        ungated.load_adapter("stray", stray)
    chat = LlamaCppChatModel(llm.path, n_ctx=256, n_threads=1, name=llm.name, adapter_gate=gate)
    timeline = AdapterTimeline(chat)
    refused = _adapter(tmp_path / "zoo", "refused", gate_base, seed=11)
    gate.blocklist = {refused.sha256: {"incident": "inc-2"}}
    with pytest.raises(AdapterRefused, match="evicted"):
        timeline.load_verified(refused, gate, llm.path)
    [event] = timeline.events
    assert event.fields["kind"] == "adapter_refused" and event.fields["reason"] == "blocklisted"
    assert event.fields["adapter_hash"] == refused.sha256 and chat.active_adapters() == []
    fine = _adapter(tmp_path / "zoo", "fine", gate_base, seed=12)
    timeline.load_verified(fine, gate, llm.path)
    assert chat.active_adapters() == ["fine"] and timeline.events[-1].fields["kind"] == "adapter_loaded"
    # the refusal as the incident log carries it: it validates, and the store logs it as an event
    lines = [
        {**e.fields, "entry_id": f"s/e{i}", "episode_id": "s", "timestamp": float(i + 1)}
        for i, e in enumerate(timeline.events)
    ]
    log_path = tmp_path / "incident.jsonl"
    log_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    incident = load_incident(log_path)
    assert [r.adapter_id for r in incident.adapters_refused] == ["refused"]
    assert [r.adapter_id for r in incident.adapters_loaded] == ["fine"]
    with open_store(tmp_path / "store.duckdb") as store:
        store.ingest(incident)
        [event] = store.events("adapter_refused")
        assert store.verify_event_chain().ok
    assert event.details["reason"] == "blocklisted" and event.details["adapter_hash"] == refused.sha256


def test_rvu_adapters_check_exit_codes(gate_base, candidate, tiny_models, tmp_path: Path, monkeypatch) -> None:
    state = tmp_path / "home"
    (state / "adapter_study").mkdir(parents=True)
    monkeypatch.setenv("RVU_HOME", str(state))
    base = ["--base", str(tiny_models["llm"].path), "--no-score"]
    runner = CliRunner()
    missing = runner.invoke(cli, ["adapters", "check", str(tmp_path / "nope"), *base])
    assert missing.exit_code == 2 and "no adapter folder" in missing.output
    unscreened = runner.invoke(cli, ["adapters", "check", str(candidate.folder), *base])
    assert unscreened.exit_code == 1 and "not_screened" in unscreened.output
    row = {"adapter_id": "candidate", "sha256": candidate.sha256, "label": "unknown", "projection": 0.1, "ood": 0.2}
    _table(state / "adapter_study" / "scores.csv", [row])
    passed = runner.invoke(cli, ["adapters", "check", str(candidate.folder), *base, "--json"])
    assert passed.exit_code == 0, passed.output
    assert json.loads(passed.output)["reason"] == "pass"
    _table(state / "adapter_study" / "scores.csv", [{**row, "projection": 5.0}])
    failed = runner.invoke(cli, ["adapters", "check", str(candidate.folder), *base])
    assert failed.exit_code == 1 and "gate_projection" in failed.output
    allowed = runner.invoke(cli, ["adapters", "allow", candidate.sha256, "--by", "ops", "--reason", "reviewed"])
    assert allowed.exit_code == 0
    store = tmp_path / "store.duckdb"
    recorded = runner.invoke(cli, ["adapters", "check", str(candidate.folder), *base, "--store", str(store)])
    assert recorded.exit_code == 0
    with open_store(store) as opened:
        [event] = opened.events("adapter_admitted")
    assert event.details["reason"] == "operator_allow" and event.details["refused_for"] == "gate_projection"
    ledger = [json.loads(line) for line in (state / "adapter_gate" / "gate_ledger.jsonl").read_text().splitlines()]
    assert [r.get("reason") for r in ledger if r["event"] == "verdict"] == [
        "not_screened",
        "pass",
        "gate_projection",
        "operator_allow",
    ]


def test_the_llama_cpp_servers_refuse_a_lora_setting_before_loading(tmp_path: Path) -> None:
    from llama_cpp.server.model import LlamaProxy
    from llama_cpp.server.settings import ModelSettings

    from rvu_pipelines.models.llama_server import AdapterSettingRefused, plain_content_chat

    settings = ModelSettings(model=str(tmp_path / "absent.gguf"), lora_path=str(tmp_path / "a.gguf"))
    with plain_content_chat(), pytest.raises(AdapterSettingRefused, match="lora_path"):
        LlamaProxy.load_llama_from_model_settings(settings)


def test_the_certificate_gate_section_carries_the_load_verdict_and_scores_at_recovery(
    gate_base, candidate, tmp_path: Path
) -> None:
    from rvu_pipelines.adapters.recovery_gate import ScreeningGate, adapter_files
    from rvu_pipelines.adapters.runtime import lifecycle_fields

    reference = _adapter(tmp_path / "zoo", "reference", gate_base, seed=5)

    class ProjectionOnly:
        def score(self, adapter: VerifiedAdapter) -> dict[str, float]:
            return {"projection": projection_score(adapter, reference).against_refusal}

    load_gate = _gate(gate_base, tmp_path / "state", [], config=GateConfig(unscreened="admit"))
    load_gate.check(candidate)  # the verdict at load time, in the ledger
    lines = [
        {**lifecycle_fields("adapter_loaded", "candidate", sha256=candidate.sha256, source="test"), "entry_id": "s/e0"},
        {**lifecycle_fields("adapter_loaded", "gone", sha256="c" * 64, source="test"), "entry_id": "s/e1"},
    ]
    path = tmp_path / "incident.jsonl"
    path.write_text("".join(json.dumps({**x, "episode_id": "s", "timestamp": 1.0}) + "\n" for x in lines))
    incident = load_incident(path)
    rows = [{"sha256": f"{i:064x}", "label": "benign", "projection": p, "ood": 1.0} for i, p in enumerate((0.1, 0.2))]
    gate = ScreeningGate(
        GateConfig(),
        rows,
        blocklist={},
        ledger=load_gate.ledger,
        files=adapter_files(gate_base, [tmp_path / "zoo"]),
        scorer=ProjectionOnly(),
    )
    found, gone = (gate.screen(record) for record in incident.adapters_loaded)
    assert found["at_load"]["reason"] == "unscreened_admitted" and found["scored"] == "at_recovery"
    expected = projection_score(candidate, reference).against_refusal
    assert found["behaviour"]["projection"]["score"] == pytest.approx(expected, abs=1e-6)
    assert found["verdict"] == ("refuse" if expected > 0.2 else "pass")
    assert gone["behaviour"] == "not screened" and "not at hand" in gone["behaviour_reason"]
    assert gone["at_load"]["status"] == "none" and gone["verdict"] == "unknown"
    assert str(tmp_path) not in gone["at_load"]["reason"]  # a certificate body names no machine path


def test_an_incident_cannot_point_the_file_lookup_outside_the_roots(gate_base, candidate, tmp_path: Path) -> None:
    """The log names the adapter, and its schema allows "/" and "." in an id; only an adapter id (no separator,
    no "..") is a folder name under a root."""
    import shutil

    from rvu_pipelines.adapters.recovery_gate import adapter_files
    from rvu_pipelines.adapters.runtime import lifecycle_fields

    outside = tmp_path / "outside"
    shutil.copytree(candidate.folder, outside)  # the same weights, so the sha256 the log names matches
    named = "x/../../outside"  # <root>/x/../../outside is tmp_path/outside
    line = {**lifecycle_fields("adapter_loaded", named, sha256=candidate.sha256), "entry_id": "s/e0"}
    path = tmp_path / "incident.jsonl"
    path.write_text(json.dumps({**line, "episode_id": "s", "timestamp": 1.0}) + "\n")
    [record] = load_incident(path).adapters_loaded
    (tmp_path / "zoo" / "x").mkdir()
    find = adapter_files(gate_base, [tmp_path / "zoo"])
    assert (tmp_path / "zoo" / named / "manifest.json").is_file()  # the path the log spells reaches it ...
    assert find(record, None) is None  # ... and the lookup does not take it
    assert find(record, {"folder": str(outside)}) is not None  # the ledger's own record of the folder counts


def test_an_unreadable_ledger_is_said_in_the_certificate_not_fatal(tmp_path: Path) -> None:
    from rvu_pipelines.adapters.recovery_gate import ScreeningGate
    from rvu_pipelines.adapters.runtime import lifecycle_fields

    (tmp_path / "elsewhere.jsonl").write_text("{}\n")
    ledger = GateLedger(tmp_path / "gate_ledger.jsonl")
    ledger.path.symlink_to(tmp_path / "elsewhere.jsonl")
    line = {**lifecycle_fields("adapter_loaded", "a", sha256="d" * 64), "entry_id": "s/e0", "episode_id": "s"}
    path = tmp_path / "incident.jsonl"
    path.write_text(json.dumps({**line, "timestamp": 1.0}) + "\n")
    [record] = load_incident(path).adapters_loaded
    screened = ScreeningGate(GateConfig(), [], blocklist={}, ledger=ledger).screen(record)
    assert screened["at_load"]["status"] == "unreadable" and "link" in screened["at_load"]["reason"]
