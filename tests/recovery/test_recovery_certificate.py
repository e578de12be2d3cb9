"""E8 (Theorem 4): signed v2 certificates; valid, complete, round-trip stable; every modification detected."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from rvu_pipelines.errors import SigningKeyError
from rvu_pipelines.provenance import write_incident
from rvu_pipelines.recovery import RecoveryFiles
from rvu_pipelines.recovery.certificate import (
    REQUIRED_FIELDS,
    certificate_bytes,
    verify_certificate,
    verify_certificate_bytes,
)
from rvu_pipelines.recovery.pipeline import recover
from rvu_pipelines.recovery.reproductions import e8_records, reproduce_certificate_audit
from rvu_pipelines.recovery.signing_keys import PRIVATE_KEY_FILE, load_or_create_signing_key, trusted_fingerprint
from rvu_pipelines.recovery.tamper_audit import leaf_paths, tamper_report, with_leaf_changed


@pytest.fixture(scope="module")
def e8(tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("e8")
    result = reproduce_certificate_audit(workdir)
    result["workdir"] = workdir
    return result


def test_e8_table8(e8: dict) -> None:
    assert e8["signature_valid"], e8["reason"]
    assert e8["fields_complete"] and e8["disk_roundtrip"] and e8["theorem_4_satisfied"]
    assert e8["membership_probe"] == "not run"
    assert (e8["evicted_adapters"], e8["retained_adapters"], e8["fusion_warnings"]) == (1, 1, 1)
    assert (e8["purged"], e8["quarantined"]) == (2, 1)
    assert e8["tier_counts"] == {"none": 3, "flag": 5, "quarantine": 1, "purge": 0, "evict": 2}


def test_every_single_field_modification_is_detected(e8: dict) -> None:
    certificate = json.loads(Path(e8["certificate_path"]).read_text())
    paths = leaf_paths(certificate)
    assert len(paths) > 150
    assert {path[0] for path in paths} >= set(REQUIRED_FIELDS) | {"signature", "manifest_digest", "version"}
    trusted = [trusted_fingerprint(e8["workdir"] / "keys")]
    report = tamper_report(certificate, trusted_fingerprints=trusted)
    assert report["undetected"] == [] and report["detected"] == len(paths) == e8["tamper_fields"]
    for path in paths:  # and each reason is specific, not a generic failure
        ok, reason = verify_certificate_bytes(
            certificate_bytes(with_leaf_changed(certificate, path)), trusted_fingerprints=trusted
        )
        assert not ok and reason


def test_every_byte_modification_is_detected(e8: dict) -> None:
    data = Path(e8["certificate_path"]).read_bytes()
    assert verify_certificate_bytes(data)[0]
    for position in range(len(data)):
        original = data[position]
        replacement = ord("0") if original != ord("0") else ord("1")
        changed = data[:position] + bytes([replacement]) + data[position + 1 :]
        assert not verify_certificate_bytes(changed)[0], f"byte {position} ({chr(original)!r}) change went undetected"
    assert not verify_certificate_bytes(data[:-1])[0] and not verify_certificate_bytes(data + b"\n")[0]


@pytest.mark.parametrize("section", sorted(REQUIRED_FIELDS) + ["signature", "manifest_digest", "version"])
def test_removing_a_section_or_field_is_detected(e8: dict, section: str) -> None:
    certificate = json.loads(Path(e8["certificate_path"]).read_text())
    removed = {k: v for k, v in certificate.items() if k != section}
    assert not verify_certificate_bytes(certificate_bytes(removed))[0]
    if isinstance(certificate[section], dict):
        for name in list(certificate[section]):
            partial = json.loads(json.dumps(certificate))
            del partial[section][name]
            assert not verify_certificate_bytes(certificate_bytes(partial))[0], f"{section}.{name}"
    added = {**certificate, "extra": 1}
    assert not verify_certificate_bytes(certificate_bytes(added))[0]


def test_resigning_with_another_key_fails_a_pinned_check(e8: dict, tmp_path: Path) -> None:
    from rvu_pipelines.recovery.certificate import sign_certificate

    certificate = json.loads(Path(e8["certificate_path"]).read_text())
    body = {k: v for k, v in certificate.items() if k not in ("manifest_digest", "signature")}
    body["runtime_recovery"]["purged"] = []  # an attacker hides the purge and re-signs with their own key
    forged = sign_certificate(body, load_or_create_signing_key(tmp_path / "attacker"))
    assert verify_certificate_bytes(certificate_bytes(forged))[0]  # self-consistent...
    ok, reason = verify_certificate_bytes(
        certificate_bytes(forged), trusted_fingerprints=[trusted_fingerprint(e8["workdir"] / "keys")]
    )
    assert not ok and "untrusted key" in reason  # ...but not by the pinned key


def test_same_incident_and_key_give_byte_identical_certificates(tmp_path: Path) -> None:
    incident = write_incident(e8_records(), tmp_path / "incident.jsonl")
    keys = tmp_path / "keys"
    outputs = []
    for run in ("one", "two"):
        cert = tmp_path / run / "cert.json"
        recover(
            incident, RecoveryFiles(tmp_path / run / "store.duckdb", keys, cert, index=tmp_path / run / "index.faiss")
        )
        outputs.append(cert.read_bytes())
    assert outputs[0] == outputs[1]
    other = tmp_path / "other" / "cert.json"
    recover(incident, RecoveryFiles(tmp_path / "other" / "store.duckdb", tmp_path / "other-keys", other))
    a, b = json.loads(outputs[0]), json.loads(other.read_bytes())
    assert a["signature"]["value"] != b["signature"]["value"]
    assert a["runtime_recovery"] == b["runtime_recovery"] | {"index": a["runtime_recovery"]["index"]}


def test_signing_key_files_and_permissions(tmp_path: Path, e8: dict) -> None:
    keys = tmp_path / "keys"
    key = load_or_create_signing_key(keys)
    private = keys / PRIVATE_KEY_FILE
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert load_or_create_signing_key(keys).fingerprint == key.fingerprint  # reused, not regenerated
    assert "PRIVATE" not in repr(key) and key.fingerprint in repr(key)
    pem = private.read_text()
    certificate_text = Path(e8["certificate_path"]).read_text()
    assert pem.split("\n")[1] not in certificate_text
    certificate = json.loads(certificate_text)
    assert certificate["signature"]["public_key_fingerprint"] == trusted_fingerprint(e8["workdir"] / "keys")
    os.chmod(private, 0o644)
    with pytest.raises(SigningKeyError, match="chmod 600"):
        load_or_create_signing_key(keys)


def test_verify_reports_unreadable_and_non_json_files(tmp_path: Path) -> None:
    assert verify_certificate(tmp_path / "missing.json") == (False, verify_certificate(tmp_path / "missing.json")[1])
    assert not verify_certificate(tmp_path / "missing.json")[0]
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x00\xff")
    ok, reason = verify_certificate(bad)
    assert not ok and "JSON" in reason
