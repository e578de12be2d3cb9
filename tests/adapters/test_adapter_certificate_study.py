"""The certificate study: the incident it builds evicts the adapter under the shipped FROC policy, its reading of a
certificate counts a section as filled only when the certificate measured the adapter, and one adapter's incident
goes through `rvu recover` itself in a scratch state that leaves the operator's state as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rvu_pipelines.adapters.certificate_study import (
    CertificateCoverage,
    CertificateStudyOptions,
    certificate_coverage,
    certify_one,
    coverage_table,
    eviction_incident,
    run_certificate_study,
    summary,
)
from rvu_pipelines.errors import InputFileError

SHA = "ab" * 32


def _recover(tmp_path: Path, lines: list[dict], name: str = "cert.json"):
    from rvu_pipelines.provenance.incident import load_incident
    from rvu_pipelines.recovery import RecoveryFiles, RecoveryOptions, recover

    log = tmp_path / f"{name}.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    files = RecoveryFiles(tmp_path / f"{name}.duckdb", tmp_path / "keys", tmp_path / name)
    return recover(load_incident(log), files, RecoveryOptions())


@pytest.mark.parametrize("fused", [False, True])
def test_the_incident_evicts_its_adapter_under_the_shipped_policy(tmp_path: Path, fused: bool) -> None:
    lines = eviction_incident("some-adapter", SHA, fused=fused)
    result = _recover(tmp_path, lines)
    assert result.evicted_adapters == ["some-adapter"]
    kinds = [line["kind"] for line in lines]
    assert ("adapter_fused" in kinds) is fused and kinds.count("adapter_loaded") == 1
    # no gate and no probe were given: the certificate says so, and the reading does not count it as filled
    row = certificate_coverage(result.certificate, "some-adapter")
    assert row.evicted and not row.filled
    assert row.gate == "not screened" and row.gate_reason
    assert row.membership == "not run" and row.membership_reason
    assert row.loaded_auroc is None and row.evicted_auroc is None


def _certificate(evicted: bool, gate_row: dict, membership_row: dict) -> dict:
    return {
        "adapter_attestation": {"evicted": ["a"] if evicted else [], "gate": {"results": {"a": gate_row}}},
        "membership_probe": {"status": "run", "adapters": {"a": membership_row}},
    }


SCORED = {
    "behaviour": {"ood": {"score": 1.0, "threshold": 2.0, "rejects": False}},
    "scored": "at_recovery",  # as recovery_gate writes it for an adapter scored on the spot
    "verdict": "pass",
}
MEASURED = {
    "status": "run",
    "verdict": "inconclusive",
    "verdict_without_base": "residual",
    "loaded": {"auroc": {"min_k_plus_plus": {"auroc": 0.97}}},
    "evicted": {"auroc": {"min_k_plus_plus": {"auroc": 0.48}}},
}


def test_a_section_counts_as_filled_only_when_it_measured_the_evicted_adapter() -> None:
    full = certificate_coverage(_certificate(True, SCORED, MEASURED), "a")
    assert full.filled and full.gate == "at_recovery" and full.gate_verdict == "pass"
    assert (full.loaded_auroc, full.evicted_auroc, full.membership_verdict) == (0.97, 0.48, "inconclusive")
    assert full.verdict_without_base == "residual" and summary([full])["residual_without_base"] == 1
    unscreened = {
        "behaviour": "not screened",
        "behaviour_reason": "no screening-table row and its files are not at hand",
    }
    no_gate = certificate_coverage(_certificate(True, unscreened, MEASURED), "a")
    assert not no_gate.filled and no_gate.gate_reason == unscreened["behaviour_reason"]
    reasoned = {"status": "not run", "reason": "its files are not at hand"}
    no_probe = certificate_coverage(_certificate(True, SCORED, reasoned), "a")
    assert not no_probe.filled and no_probe.membership_reason == "its files are not at hand"
    # the evidence behind a verdict: a clean eviction of an adapter the probe never saw loaded is counted apart
    assert full.probe_saw_adapter is None  # a section without the field: not measured, not "no"
    clean = {**MEASURED, "verdict": "clean", "verdict_without_base": "clean"}
    seen = certificate_coverage(_certificate(True, SCORED, {**clean, "probe_saw_adapter": True}), "a")
    unseen = certificate_coverage(_certificate(True, SCORED, {**clean, "probe_saw_adapter": False}), "a")
    counts = summary([seen, unseen])
    assert (counts["probe_saw_adapter"], counts["clean_and_seen"]) == (1, 1)
    table = "\n".join(coverage_table([seen, unseen]))
    assert table.count("the probe did not see the adapter loaded") == 1
    kept = certificate_coverage(_certificate(False, SCORED, MEASURED), "a")
    assert not kept.filled and not kept.evicted
    absent = certificate_coverage({}, "a")
    assert not absent.filled and absent.gate_reason and absent.membership_reason


def _row(adapter_id: str, *, filled: bool = True, evicted: bool = True) -> CertificateCoverage:
    membership = "run" if filled else "not run"
    return CertificateCoverage(adapter_id, evicted, "table", "pass", "", membership, "", "why", "", 0.9, 0.5, 1.0)


def test_the_goal_needs_every_certificate_to_be_of_an_eviction_and_filled() -> None:
    assert summary([_row("a"), _row("b")])["goal_met"]
    missing = summary([_row("a"), _row("b", filled=False)])
    assert not missing["goal_met"] and missing["both_filled"] == 1 and missing["membership_run"] == 1
    assert not summary([_row("a"), _row("b", evicted=False)])["goal_met"]  # an incident that evicted nothing
    assert not summary([])["goal_met"]


def test_the_study_writes_its_table_and_refuses_a_state_without_a_screening_table(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "adapters").mkdir(parents=True)
    options = CertificateStudyOptions(ids=("style-upper", "persona-hostile"))
    with pytest.raises(InputFileError, match="scores.csv"):
        run_certificate_study(options, tmp_path / "out", state=state, command="pytest", say=lambda _: None)
    table = state / "adapter_study" / "scores.csv"
    table.parent.mkdir()
    table.write_text("adapter_id\n")
    seen: list[str] = []

    def certify(adapter_id: str, st: Path, screening: Path, opts: CertificateStudyOptions) -> CertificateCoverage:
        assert (st, screening, opts) == (state, table, options)
        seen.append(adapter_id)
        return _row(adapter_id, filled=adapter_id == "style-upper")

    document = run_certificate_study(
        options, tmp_path / "out", state=state, command="pytest", certify=certify, say=lambda _: None
    )
    assert seen == ["style-upper", "persona-hostile"]
    assert document["summary"]["both_filled"] == 1 and not document["summary"]["goal_met"]
    written = json.loads((tmp_path / "out" / "certificates.json").read_text())
    assert written["summary"] == document["summary"] and [r["filled"] for r in written["rows"]] == [True, False]
    page = (tmp_path / "out" / "certificates.md").read_text()
    assert "not met" in page and "not run: why" in page and "`pytest`" in page
    with pytest.raises(ValueError, match="no-such-adapter"):
        run_certificate_study(
            CertificateStudyOptions(ids=("no-such-adapter",)), tmp_path / "out", state=state, command="pytest"
        )


def test_one_incident_goes_through_rvu_recover_in_a_scratch_state(gate_base, noise, tmp_path: Path) -> None:
    """The subprocess path end to end: the gate section from the screening table, the membership section's
    reason (a noise adapter's manifest records no training data), the operator's state untouched."""
    from rvu_pipelines.adapters.files import save_adapter
    from rvu_pipelines.adapters.gate import GateConfig
    from rvu_pipelines.adapters.study import AdapterScore, write_gate_report

    state = tmp_path / "state"
    fields = {"adapter_id": "noise-evicted", "label": "harmful", "category": "test", "source": "test", "rank": 4}
    fields |= {"alpha": 8, "target_modules": ["v_proj", "o_proj"], "steps": 1}
    manifest = save_adapter(state / "adapters" / "noise-evicted", noise(), fields, base=gate_base)

    def score(i: int, label: str, sha: str, lift: float) -> AdapterScore:
        values = {"projection": lift, "ood": 1.0 + lift, "behaviour": lift, "sensitive": 0.01 * i, "qa_drop": 0.0}
        return AdapterScore(
            adapter_id=f"{label}-{i}",
            label=label,
            category="test",
            sha256=sha,
            safe_lora=0.5,
            influence=0.1,
            embedding_distance=0.2,
            token_divergence=0.3,
            gate_seconds=1.0,
            influence_seconds=0.5,
            behaviour_texts=32,
            follow_up_classes="{}",
            **values,
        )

    scores = [score(i, "benign", f"{i:064x}", 0.01 * i) for i in range(6)]
    harmful = score(9, "harmful", manifest.sha256, 5.0)
    write_gate_report([*scores, harmful], GateConfig(), state / "adapter_study", command="pytest")
    before = sorted(str(p.relative_to(state)) for p in state.rglob("*"))

    row = certify_one("noise-evicted", state, state / "adapter_study" / "scores.csv", CertificateStudyOptions())
    assert row.error == ""
    assert row.evicted and row.gate == "table" and row.gate_verdict == "refuse"
    assert row.membership == "not run" and "its members are unknown" in row.membership_reason
    assert not row.filled
    assert sorted(str(p.relative_to(state)) for p in state.rglob("*")) == before  # no blocklist, key or store here


def test_an_adapter_without_a_readable_manifest_is_a_failed_row_not_a_failed_study(tmp_path: Path) -> None:
    row = certify_one("absent", tmp_path, tmp_path / "scores.csv", CertificateStudyOptions())
    assert row.error.startswith("its manifest cannot be read") and not row.filled and not row.evicted
    assert summary([row])["failed_runs"] == 1


def test_rvu_recover_names_the_adapters_the_probe_could_not_see_loaded() -> None:
    from rvu_pipelines.cli_recovery import membership_line

    seen = {"status": "run", "verdict": "clean", "probe_saw_adapter": True}
    section = {"status": "run", "verdict": "clean", "adapters": {"b": {**seen, "probe_saw_adapter": False}, "a": seen}}
    line = membership_line(section)
    assert line.startswith("membership probe: clean;") and "did not see b while loaded" in line and " a " not in line
    assert membership_line({"status": "run", "verdict": "clean", "adapters": {"a": seen}}) == "membership probe: clean"
    not_run = {"status": "not run", "reason": "this recovery evicted no adapter"}
    assert membership_line(not_run) == "membership probe: not run (this recovery evicted no adapter)"
