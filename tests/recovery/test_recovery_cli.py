"""`rvu recover`, `rvu verify` and `rvu restore` as an operator runs them: the installed console script for the
first recovery and its verification, the same commands in-process (``rvu_in_process``) for the rest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
RVU = shutil.which("rvu") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "rvu")


def _console_script(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RVU, *args], capture_output=True, text=True, timeout=300, env={**os.environ, "RVU_HOME": str(home)}
    )


@pytest.fixture
def _rvu(rvu_in_process) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return rvu_in_process(*args, env={"RVU_HOME": str(home), **env})

    return run


@pytest.fixture(scope="module")
def recovered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    home = tmp_path_factory.mktemp("cli_home")
    cert = home / "cert.json"
    done = _console_script(home, "recover", str(EXAMPLES / "incident_example.jsonl"), "--cert-out", str(cert))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "certificate" in done.stdout and "created signing key sha256:" in done.stdout
    assert "resulting state" in done.stdout
    return home, cert


def test_verify_accepts_the_certificate_and_rejects_a_modified_one(recovered, _rvu) -> None:
    home, cert = recovered
    assert _console_script(home, "verify", str(cert)).returncode == 0
    body = json.loads(cert.read_text())
    body["runtime_recovery"]["total_purged"] += 1
    tampered = home / "tampered.json"
    tampered.write_text(json.dumps(body, sort_keys=True))
    done = _rvu(home, "verify", str(tampered))
    assert done.returncode == 1 and "INVALID" in done.stdout and "Traceback" not in done.stdout + done.stderr


def test_the_certificate_says_why_each_adapter_was_not_measured_unless_disabled(recovered, tmp_path, _rvu) -> None:
    home, cert = recovered
    section = json.loads(cert.read_text())["membership_probe"]
    assert section["status"] == "not run" and section["reason"]
    assert set(section["adapters"]) == {"fin-lora", "mail-lora"}  # the adapters the incident loaded
    assert all(a["status"] == "not run" and a["reason"] for a in section["adapters"].values())
    off = tmp_path / "cert.json"
    example = str(EXAMPLES / "incident_example.jsonl")
    done = _rvu(tmp_path, "recover", example, "--cert-out", str(off), "--no-membership")
    assert done.returncode == 0, done.stdout + done.stderr
    disabled = {"status": "not run", "reason": "disabled by --no-membership"}
    assert json.loads(off.read_text())["membership_probe"] == disabled


def test_restore_lifts_a_quarantine_once(recovered, _rvu) -> None:
    home, cert = recovered
    [quarantined] = json.loads(cert.read_text())["runtime_recovery"]["quarantined"]
    first = _rvu(home, "restore", quarantined)
    assert first.returncode == 0 and f"restored {quarantined}" in first.stdout
    second = _rvu(home, "restore", quarantined)
    assert second.returncode == 0 and "nothing changed" in second.stdout


def test_malformed_incident_is_refused_with_file_line_and_field(tmp_path, _rvu) -> None:
    done = _rvu(tmp_path, "recover", str(EXAMPLES / "incident_malformed.jsonl"))
    assert done.returncode == 2
    assert "incident_malformed.jsonl:3: field 'timestamp'" in done.stdout and "nothing was ingested" in done.stdout
    assert not (tmp_path / "recovery" / "provenance.duckdb").exists()


def test_a_lost_key_or_an_unwritable_cert_out_is_refused_before_any_change(recovered, tmp_path, _rvu) -> None:
    home, _ = recovered
    copy = tmp_path / "home"
    shutil.copytree(home / "recovery", copy / "recovery", ignore=shutil.ignore_patterns("keys"))
    (copy / "recovery" / "certificates").mkdir(exist_ok=True)
    (copy / "recovery" / "certificates" / "earlier.json").write_text("{}")
    # both are refused before any model loads: an embedder that cannot be found changes neither answer
    no_model = {"RVU_MODEL_EMBEDDER_PATH": str(tmp_path / "no-such-embedder")}
    example = str(EXAMPLES / "incident_example.jsonl")
    lost = _rvu(copy, "recover", example, "--cert-out", str(tmp_path / "c.json"), **no_model)
    assert lost.returncode == 1 and "--new-key" in lost.stdout and "Traceback" not in lost.stdout + lost.stderr
    assert not (copy / "recovery" / "keys" / "ed25519_private.pem").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = _rvu(home, "recover", example, "--cert-out", str(blocker / "c.json"), **no_model)
    assert done.returncode == 2 and "Nothing was changed" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_recover_and_restore_use_the_postgres_store_named_by_the_environment(
    tmp_path: Path, postgres_location: str, _rvu
) -> None:
    """RVU_PROVENANCE_STORE switches the CLI to a shared PostgreSQL store (the scale profile); no DuckDB file."""
    incident = str(EXAMPLES / "incident_example.jsonl")
    done = _rvu(tmp_path, "recover", incident, RVU_PROVENANCE_STORE=postgres_location)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(tmp_path.rglob("*.duckdb"))
    from rvu_pipelines.provenance import open_store

    with open_store(postgres_location, read_only=True) as store:
        quarantined = [e for e in store.events("quarantined")]
        assert store.entry_count > 0 and store.verify_event_chain().ok and quarantined
        entry_id = store.entry_ids(quarantined[0].subjects[:1])[0]
    restored = _rvu(tmp_path, "restore", entry_id, RVU_PROVENANCE_STORE=postgres_location)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    with open_store(postgres_location, read_only=True) as store:
        assert not store.entry(entry_id).quarantined


def test_links_planted_at_and_beside_the_certificate_path_are_replaced_never_written_through(tmp_path, _rvu) -> None:
    """``cert.json.tmp`` and ``cert.json`` itself planted as links to other files: recovery leaves both victims
    as they were and writes cert.json as a new regular file, with no temporary file left behind."""
    out = tmp_path / "out"
    out.mkdir()
    beside, at = tmp_path / "victim-beside.txt", tmp_path / "victim-at.txt"
    beside.write_text("beside\n")
    at.write_text("at\n")
    (out / "cert.json.tmp").symlink_to(Path("..") / beside.name)
    (out / "cert.json").symlink_to(at)
    cert = out / "cert.json"
    done = _rvu(tmp_path / "home", "recover", str(EXAMPLES / "incident_example.jsonl"), "--cert-out", str(cert))
    assert done.returncode == 0, done.stdout + done.stderr
    assert beside.read_text() == "beside\n" and at.read_text() == "at\n"
    assert not cert.is_symlink() and cert.is_file() and json.loads(cert.read_text())["signature"]
    assert sorted(path.name for path in out.iterdir()) == ["cert.json", "cert.json.tmp"]  # the planted link stays
    assert _rvu(tmp_path / "home", "verify", str(cert)).returncode == 0


def test_a_log_a_new_store_refuses_leaves_no_key_and_no_store(tmp_path, _rvu) -> None:
    """A parent the file does not define cannot be in a store that does not exist yet: refused with file, line
    and field before the signing key or the store file is created."""
    from rvu_pipelines.provenance import write_incident
    from rvu_pipelines.recovery.reproductions import e2_records

    records = e2_records()
    records[2]["parent_id"] = "not-in-this-file"
    incident = write_incident(records, tmp_path / "orphan.jsonl")
    state = tmp_path / "state"
    done = _rvu(tmp_path / "home", "recover", str(incident), "--state", str(state))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "orphan.jsonl:3: field 'parent_id'" in done.stdout and "not-in-this-file" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert not list(state.rglob("*.pem")) and not list(state.rglob("*.duckdb*"))
