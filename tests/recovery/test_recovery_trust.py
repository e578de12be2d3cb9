"""Who signed a certificate, and files that try to fool `rvu verify`.

Verification without a pinned key proves only integrity, so the CLI refuses it unless asked for
--integrity-only; keys are created only where no earlier certificate would be orphaned; hostile files
(re-signed, unsigned, truncated, reordered, /dev/zero, FIFO, random mutations) exit 1 or 2, never hang
and never print a traceback.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rvu_pipelines.cli import cli
from rvu_pipelines.errors import SigningKeyError
from rvu_pipelines.provenance import load_incident, write_incident
from rvu_pipelines.recovery import RecoveryFiles, RecoveryOptions
from rvu_pipelines.recovery.certificate import check_certificate
from rvu_pipelines.recovery.pipeline import recover
from rvu_pipelines.recovery.reproductions import e2_records
from rvu_pipelines.recovery.signing_keys import (
    PRIVATE_KEY_FILE,
    PUBLIC_KEY_FILE,
    fingerprint_trusted,
    load_or_create_signing_key,
    open_signing_key,
    read_trust_file,
    trusted_fingerprint,
)

CORPUS = Path(__file__).resolve().parent / "hostile_certificates"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
PINNED = EXPECTED["pinned"]


def rvu(home: Path, *args: str) -> Result:
    """The CLI in-process, with RVU_HOME at ``home``; exit codes as the console script gives them."""
    return CliRunner().invoke(cli, list(args), env={"RVU_HOME": str(home)}, catch_exceptions=True)


def assert_clean_exit(result: Result, *codes: int) -> None:
    assert result.exit_code in codes, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def recovered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trust")
    home = root / "home"
    paths = {"home": home, "state": home / "recovery", "cert": root / "cert.json"}
    incident = write_incident(e2_records(), root / "e2.jsonl")
    state = paths["state"]
    recover(
        incident,
        RecoveryFiles(state / "provenance.duckdb", state / "keys", paths["cert"], certificates=state / "certificates"),
    )
    return paths


# ------------------------------------------------------------------------------------ pinning


def test_unpinned_verify_fails_loudly_unless_integrity_only(recovered, tmp_path: Path) -> None:
    empty_home = tmp_path / "auditor"
    done = rvu(empty_home, "verify", str(recovered["cert"]))
    assert_clean_exit(done, 1)
    assert "UNVERIFIED SIGNER" in done.output and "--pin" in done.output
    integrity = rvu(empty_home, "verify", "--integrity-only", str(recovered["cert"]))
    assert_clean_exit(integrity, 0)
    assert "NOT verified" in integrity.output
    assert not empty_home.exists()  # verify creates no state on a machine that never recovered


def test_pin_trust_alias_and_trust_files(recovered, tmp_path: Path) -> None:
    fingerprint = trusted_fingerprint(recovered["state"] / "keys")
    assert fingerprint
    empty_home = tmp_path / "auditor"
    assert_clean_exit(rvu(empty_home, "verify", "--pin", fingerprint, str(recovered["cert"])), 0)
    assert_clean_exit(
        rvu(empty_home, "verify", "--trust", fingerprint.upper().replace("SHA256:", ""), str(recovered["cert"])), 0
    )
    wrong = rvu(empty_home, "verify", "--pin", PINNED, str(recovered["cert"]))
    assert_clean_exit(wrong, 1)
    assert "untrusted key" in wrong.output
    assert_clean_exit(rvu(empty_home, "verify", "--pin", "not-a-fingerprint", str(recovered["cert"])), 2)
    trust = tmp_path / "trusted.txt"
    trust.write_text(f"# auditors' list\n\n{PINNED}  # the corpus key\n{fingerprint}\n")
    assert read_trust_file(trust) == [PINNED, fingerprint]
    assert_clean_exit(rvu(empty_home, "verify", "--trust-file", str(trust), str(recovered["cert"])), 0)
    trust.write_text("sha256:1234\n")
    bad = rvu(empty_home, "verify", "--trust-file", str(trust), str(recovered["cert"]))
    assert_clean_exit(bad, 2)
    assert "trusted.txt:1" in bad.output
    conflicting = rvu(empty_home, "verify", "--integrity-only", "--pin", fingerprint, str(recovered["cert"]))
    assert_clean_exit(conflicting, 2)


@pytest.mark.parametrize("content", ["", "\n\n", "# nobody yet\n   # sha256:0000\n"])
def test_a_trust_file_without_a_fingerprint_is_an_error_not_a_fallback(recovered, content: str, tmp_path: Path) -> None:
    """On the signing machine itself, where the machine's key would verify the certificate, an empty or
    comments-only --trust-file trusts nobody: exit 2 naming the file and the fix, never exit 0."""
    trust = tmp_path / "auditors.txt"
    trust.write_text(content)
    done = rvu(recovered["home"], "verify", "--trust-file", str(trust), str(recovered["cert"]))
    assert_clean_exit(done, 2)
    assert str(trust) in done.output and "holds no fingerprint" in done.output and "rvu keys show" in done.output
    fingerprint = trusted_fingerprint(recovered["state"] / "keys")
    both = rvu(
        recovered["home"], "verify", "--pin", str(fingerprint), "--trust-file", str(trust), str(recovered["cert"])
    )
    assert_clean_exit(both, 2)


def test_named_pins_replace_the_machines_pins(recovered, tmp_path: Path) -> None:
    """With --pin or --trust-file only those keys are trusted, also on the machine whose own key signed."""
    trust = tmp_path / "other.txt"
    trust.write_text(f"{PINNED}\n")
    for option, value in (("--pin", PINNED), ("--trust-file", str(trust))):
        done = rvu(recovered["home"], "verify", option, value, str(recovered["cert"]))
        assert_clean_exit(done, 1)
        assert "untrusted key" in done.output and "this machine's key" not in done.output


def test_an_oversized_trust_file_names_its_fixed_limit(recovered, tmp_path: Path, monkeypatch) -> None:
    """The trust file's limit is fixed, so the refusal says so and why, and does not send the user to
    RVU_MAX_INPUT_MB (which would change nothing)."""
    trust = tmp_path / "huge.txt"
    trust.write_text(f"{PINNED}\n" * 20_000)
    monkeypatch.setenv("RVU_MAX_INPUT_MB", "512")
    done = rvu(recovered["home"], "verify", "--trust-file", str(trust), str(recovered["cert"]))
    assert_clean_exit(done, 2)
    assert "fixed 1.0 MiB limit for a trust file" in done.output and "fingerprints" in done.output
    assert "RVU_MAX_INPUT_MB" not in done.output


def test_default_trust_file_in_the_state_folder(recovered, tmp_path: Path) -> None:
    home = tmp_path / "auditor"
    (home / "recovery").mkdir(parents=True)
    (home / "recovery" / "trusted_keys.txt").write_text(f"{trusted_fingerprint(recovered['state'] / 'keys')}\n")
    done = rvu(home, "verify", str(recovered["cert"]))
    assert_clean_exit(done, 0)
    assert "trusted_keys.txt" in done.output


def test_the_machines_key_pins_its_own_certificates(recovered) -> None:
    done = rvu(recovered["home"], "verify", str(recovered["cert"]))
    assert_clean_exit(done, 0)
    assert "pinned key" in done.output


def test_fingerprint_comparison() -> None:
    assert fingerprint_trusted(PINNED, ["sha256:" + "0" * 64, PINNED])
    assert not fingerprint_trusted(PINNED, []) and not fingerprint_trusted(PINNED, [PINNED[:-1]])
    assert not fingerprint_trusted(PINNED, ["sha256:é"])  # non-ASCII input is compared, not a crash


# ------------------------------------------------------------------------------------ keys


def test_deleted_public_key_is_derived_from_the_private_key(tmp_path: Path) -> None:
    key = load_or_create_signing_key(tmp_path / "keys")
    assert key.created
    (tmp_path / "keys" / PUBLIC_KEY_FILE).unlink()
    assert trusted_fingerprint(tmp_path / "keys") == key.fingerprint  # never None: the private key is there
    assert (tmp_path / "keys" / PUBLIC_KEY_FILE).exists()
    assert not load_or_create_signing_key(tmp_path / "keys").created


def test_a_public_key_of_another_key_is_refused(tmp_path: Path) -> None:
    load_or_create_signing_key(tmp_path / "keys")
    other = load_or_create_signing_key(tmp_path / "other")
    (tmp_path / "keys" / PUBLIC_KEY_FILE).write_bytes(other.public_pem)
    with pytest.raises(SigningKeyError, match="inconsistent"):
        trusted_fingerprint(tmp_path / "keys")


def test_a_lost_key_folder_is_an_error_not_a_silent_new_key(tmp_path: Path) -> None:
    incident = write_incident(e2_records(), tmp_path / "e2.jsonl")
    store, keys, certs = tmp_path / "s.duckdb", tmp_path / "keys", tmp_path / "certificates"
    first = recover(incident, RecoveryFiles(store, keys, certs / "e2.json", certificates=certs))
    assert first.key_created
    (keys / PRIVATE_KEY_FILE).unlink()
    (keys / PUBLIC_KEY_FILE).unlink()
    with pytest.raises(SigningKeyError) as caught:
        recover(incident, RecoveryFiles(store, keys, certs / "again.json", certificates=certs))
    message = str(caught.value)
    assert str(keys) in message and str(certs) in message and str(store) in message and "--new-key" in message
    assert not (certs / "again.json").exists() and not (keys / PRIVATE_KEY_FILE).exists()
    second = recover(
        incident, RecoveryFiles(store, keys, certs / "again.json", certificates=certs), RecoveryOptions(new_key=True)
    )
    assert second.key_created and second.key_fingerprint != first.key_fingerprint
    with pytest.raises(SigningKeyError, match="never replaced"):
        open_signing_key(keys, new_key=True)


def test_keys_show_and_export_print_the_public_half_only(tmp_path: Path) -> None:
    """`rvu recover` itself needs the embedding model; the key step it shares is checked through the
    library above. Here: `keys show` / `keys export` print the public half only, and create nothing."""
    home = tmp_path / "home"
    missing = rvu(home, "keys", "show")
    assert_clean_exit(missing, 2)
    assert "No signing key" in missing.output and not home.exists()
    key = load_or_create_signing_key(home / "recovery" / "keys")
    shown = rvu(home, "keys", "show")
    assert_clean_exit(shown, 0)
    private_pem = (home / "recovery" / "keys" / PRIVATE_KEY_FILE).read_text()
    assert key.fingerprint in shown.output and "BEGIN PUBLIC KEY" in shown.output
    assert "PRIVATE" not in shown.output and private_pem.splitlines()[1] not in shown.output
    exported = rvu(home, "keys", "export", str(tmp_path / "pub.pem"))
    assert_clean_exit(exported, 0)
    assert (tmp_path / "pub.pem").read_bytes() == key.public_pem
    assert trusted_fingerprint_of_pem(tmp_path / "pub.pem") == key.fingerprint


def test_keys_export_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    key = load_or_create_signing_key(home / "recovery" / "keys")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "pub.pem").symlink_to(victim)
    (out / "pub.pem.tmp").symlink_to(victim)
    assert_clean_exit(rvu(home, "keys", "export", str(out / "pub.pem")), 0)
    assert victim.read_text() == "precious\n"
    assert not (out / "pub.pem").is_symlink() and (out / "pub.pem").read_bytes() == key.public_pem


def trusted_fingerprint_of_pem(path: Path) -> str | None:
    folder = path.parent / "auditor-keys"
    folder.mkdir(exist_ok=True)
    (folder / PUBLIC_KEY_FILE).write_bytes(path.read_bytes())
    return trusted_fingerprint(folder)


def test_restore_on_an_empty_home_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = rvu(home, "restore", "t1")
    assert_clean_exit(done, 2)
    assert "No provenance store" in done.output and not home.exists()


# ------------------------------------------------------------------------------------ hostile files


@pytest.mark.parametrize("name", sorted(EXPECTED["files"]))
def test_hostile_corpus(name: str, tmp_path: Path) -> None:
    code, reason = EXPECTED["files"][name]
    verdict = check_certificate(CORPUS / name, trusted_fingerprints=[PINNED])
    assert verdict.ok == (code == 0) and reason in verdict.reason
    done = rvu(tmp_path, "verify", "--pin", PINNED, str(CORPUS / name))
    assert_clean_exit(done, code)


def test_a_resigned_certificate_is_only_self_consistent(tmp_path: Path) -> None:
    path = CORPUS / "resigned_by_other_key.json"
    assert_clean_exit(rvu(tmp_path, "verify", "--integrity-only", str(path)), 0)
    assert_clean_exit(rvu(tmp_path, "verify", str(path)), 1)


def test_dev_zero_and_fifo_are_refused_without_hanging(tmp_path: Path) -> None:
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (zero, fifo, tmp_path / "missing.json", tmp_path):
        results: list[Result] = []

        def run(target: Path = path, out: list[Result] = results) -> None:
            out.append(rvu(tmp_path, "verify", "--pin", PINNED, str(target)))

        worker = threading.Thread(target=run)
        worker.start()
        worker.join(timeout=20)
        assert not worker.is_alive(), f"verify hung on {path}"
        assert_clean_exit(results[0], 2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    operation=st.sampled_from(["flip", "truncate", "insert", "delete", "splice"]),
)
def test_mutated_certificates_exit_0_1_or_2_without_traceback(
    tmp_path: Path, data: st.DataObject, operation: str
) -> None:
    original = (CORPUS / "genuine.json").read_bytes()
    position = data.draw(st.integers(0, len(original) - 1))
    if operation == "flip":
        mutated = (
            original[:position]
            + bytes([original[position] ^ data.draw(st.integers(1, 255))])
            + original[position + 1 :]
        )
    elif operation == "truncate":
        mutated = original[:position]
    elif operation == "insert":
        mutated = original[:position] + data.draw(st.binary(min_size=1, max_size=8)) + original[position:]
    elif operation == "delete":
        mutated = original[:position] + original[position + data.draw(st.integers(1, 16)) :]
    else:
        mutated = original[:position] + original[data.draw(st.integers(0, len(original) - 1)) :]
    path = tmp_path / "mutated.json"
    path.write_bytes(mutated)
    done = rvu(tmp_path / "home", "verify", "--pin", PINNED, str(path))
    assert_clean_exit(done, 0, 1, 2)
    if mutated != original:
        assert done.exit_code != 0


def test_a_refused_key_on_a_new_store_leaves_no_store_file(tmp_path: Path) -> None:
    """Certificates exist but the key folder is gone and the store is new (moved state): the refusal
    comes before the store file is created, so nothing is left half-made."""
    incident = write_incident(e2_records(), tmp_path / "e2.jsonl")
    keys, certs = tmp_path / "keys", tmp_path / "certificates"
    recover(incident, RecoveryFiles(tmp_path / "old.duckdb", keys, certs / "e2.json", certificates=certs))
    (keys / PRIVATE_KEY_FILE).unlink()
    (keys / PUBLIC_KEY_FILE).unlink()
    new_store = tmp_path / "new.duckdb"
    with pytest.raises(SigningKeyError, match="--new-key"):
        recover(incident, RecoveryFiles(new_store, keys, certs / "again.json", certificates=certs))
    assert not new_store.exists() and not list(tmp_path.glob("new.duckdb*"))


def test_recover_takes_an_already_validated_log(tmp_path: Path) -> None:
    """The CLI validates once and hands the parsed log over: recovery never re-reads a file that may have
    changed since (the certificate then describes exactly what was validated)."""
    path = write_incident(e2_records(), tmp_path / "e2.jsonl")
    log = load_incident(path)
    path.write_text("not json\n")  # the file changes after validation
    result = recover(log, RecoveryFiles(tmp_path / "s.duckdb", tmp_path / "keys", tmp_path / "c.json"))
    assert result.incident_id == log.incident_id
