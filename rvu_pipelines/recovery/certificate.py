"""V2 recovery certificates (seed 000 §3.8, Theorem 4): canonical JSON, SHA-256 digest, Ed25519 signature.

The paper's code "signs" with a bare SHA-256, which proves nothing to an auditor: anyone who edits the file
can recompute it. Here the digest covers the certificate body and an Ed25519 signature covers the
digest and the signer's key fingerprint, so an edit is caught unless the editor holds the private key.
An auditor pins the fingerprint (``trusted_fingerprints``: ``rvu verify --pin``, a trust file, or this
machine's own key). Without a pin only integrity is checked: anyone can make a self-consistent
certificate with a key of their own, so :class:`Verdict` says ``pinned=False`` and the CLI refuses it
unless ``--integrity-only`` was asked for.

Keys: a key folder holds the private key (0600) and its public key. A key is created only where
nothing would be orphaned by it (:func:`open_signing_key`): a lost key folder next to earlier
certificates or recorded recoveries is an error naming both, never a silent new key. Keys are never
logged or printed; fingerprints and public keys are.

Byte-level rules: the file is exactly ``canonical_json(certificate) + "\\n"`` (sorted keys, no
whitespace, ASCII, floats with six decimals), so changing any byte either breaks the JSON, breaks the
canonical form, or changes a value the digest covers. The same incident and key give the same bytes:
Ed25519 signatures are deterministic and the body holds no wall-clock time or path.

Version 3 added what actually happened next to what this run did: ``runtime_recovery.flagged`` /
``quarantined`` / ``purged`` are this run's *actions* (the tier plan), ``resulting_state`` is every
closure entry's state read back from the store afterwards, ``kept_restored`` lists entries an operator
restored that this run left restored, and ``truncated_at_depth`` / ``entries_beyond_depth`` say whether
the closure's depth bound left descendants untouched.

:mod:`certificate_body` assembles a recovery's body from the store's state; :mod:`signing_keys` holds the
keys and trust files.
"""

from __future__ import annotations

import base64
import hmac
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.bounded_io import read_input_file, truncate_for_message
from rvu_pipelines.errors import InputFileError, RvuError
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.provenance.canonical import canonical_bytes, strict_loads
from rvu_pipelines.recovery.signing_keys import SigningKey, fingerprint_trusted, public_key_fingerprint

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

CERTIFICATE_VERSION = 3
# what changed in each format version, for a clear message on an older certificate
VERSION_CHANGES = {
    2: "version 2 certificates list only this run's actions; version 3 adds the resulting state of every "
    "closure entry, operator restores kept, and closure depth truncation",
}
SIGNATURE_ALGORITHM = "Ed25519"

# section -> keys it must hold (the "fields complete" check of E8)
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "incident": ("incident_id", "sha256", "records", "episodes"),
    "policy": ("weights", "thresholds", "propagation_depth", "closure_max_depth", "seed_threshold"),
    "detector": ("name", "version"),
    "runtime_recovery": (
        "seed_ids",
        "closure_ids",
        "closure_v1_ids",
        "closure_size",
        "closure_v1_size",
        "adapter_expansion_gain",
        "flagged",
        "quarantined",
        "purged",
        "total_flagged",
        "total_quarantined",
        "total_purged",
        "manifest_entries",
        "tier_counts",
        "state_digest",
        "index",
        "resulting_state",
        "kept_restored",
        "truncated_at_depth",
        "entries_beyond_depth",
    ),
    "adapter_attestation": ("adapters", "tainted", "evicted", "retained", "fusion_warnings", "gate"),
    "risk_scores": ("entries", "total_entries"),
    "membership_probe": ("status",),
}
BODY_KEYS = ("version", "certificate_type", "generated_by", *REQUIRED_FIELDS)


class CertificateOutputError(RvuError):
    """The certificate cannot be written where asked; raised before recovery changes any state."""


def _signed_message(manifest_digest: str, fingerprint: str) -> bytes:
    return canonical_bytes(
        {"algorithm": SIGNATURE_ALGORITHM, "manifest_digest": manifest_digest, "public_key_fingerprint": fingerprint}
    )


def _body(certificate: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in certificate.items() if key not in ("manifest_digest", "signature")}


def manifest_digest(body: Mapping[str, Any]) -> str:
    return "sha256:" + sha256_bytes(canonical_bytes(body))


def sign_certificate(body: Mapping[str, Any], key: SigningKey) -> dict[str, Any]:
    """Add the manifest digest and the Ed25519 signature to a certificate body."""
    missing = completeness_problems(body)
    if missing:
        raise ValueError(f"certificate body incomplete: {missing[0]}")
    digest = manifest_digest(body)
    signature = key.private_key.sign(_signed_message(digest, key.fingerprint))
    return {
        **body,
        "manifest_digest": digest,
        "signature": {
            "algorithm": SIGNATURE_ALGORITHM,
            "public_key": key.public_b64,
            "public_key_fingerprint": key.fingerprint,
            "value": base64.b64encode(signature).decode("ascii"),
        },
    }


def certificate_bytes(certificate: Mapping[str, Any]) -> bytes:
    """The exact bytes a certificate file holds."""
    return canonical_bytes(certificate) + b"\n"


def write_certificate(certificate: Mapping[str, Any], path: Path | str) -> Path:
    """Write atomically so a reader never sees half a certificate, and a link planted at ``path`` or
    beside it is replaced, never written through."""
    return write_atomically(path, certificate_bytes(certificate))


def check_writable(path: Path | str) -> Path:
    """Make sure a certificate can be written at ``path`` before recovery changes anything.

    Creates the parent folder and a probe file in it (then removes it), so a read-only folder or a path
    through a file fails here, with nothing purged yet, instead of after the tiers committed.
    """
    path = Path(path)
    fix = "Nothing was changed; pass a writable --cert-out (or fix the folder's permissions) and run again."
    if path.is_dir():
        raise CertificateOutputError(f"Certificate output {path} is a folder. {fix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as exc:
        raise CertificateOutputError(f"Cannot write the certificate to {path}: {exc.strerror or exc}. {fix}") from None
    return path


def completeness_problems(certificate: Mapping[str, Any]) -> list[str]:
    """Missing or mistyped sections and fields; empty when complete."""
    problems: list[str] = []
    version = certificate.get("version")
    if version != CERTIFICATE_VERSION:
        if type(version) is int and version in VERSION_CHANGES:
            return [
                f"certificate format version {version} is older than this rvu's version {CERTIFICATE_VERSION} "
                f"({VERSION_CHANGES[version]}); re-issue it by running `rvu recover` on the incident again, or "
                "verify it with the rvu-pipelines release that wrote it"
            ]
        problems.append(f"version must be {CERTIFICATE_VERSION}, found {truncate_for_message(version, 40)}")
    for key in BODY_KEYS:
        if key not in certificate:
            problems.append(f"missing section '{key}'")
    for section, fields in REQUIRED_FIELDS.items():
        value = certificate.get(section)
        if section in certificate and not isinstance(value, Mapping):
            problems.append(f"section '{section}' must be an object")
            continue
        for name in fields if isinstance(value, Mapping) else ():
            if name not in value:  # type: ignore[operator]  # value is a Mapping here (the loop is empty otherwise)
                problems.append(f"missing field '{section}.{name}'")
    probe = certificate.get("membership_probe")
    if isinstance(probe, Mapping) and not isinstance(probe.get("status"), str):
        problems.append("membership_probe.status must be a string")
    return problems


@dataclass(frozen=True)
class Verdict:
    """What verification found.

    ``ok``: the bytes are a complete canonical certificate whose digest and Ed25519 signature hold and,
    when pins were given, whose signer is one of them. ``pinned`` says whether the signer was checked
    against pins at all: ``ok and not pinned`` proves integrity only, since anyone can sign with a key of
    their own. ``signer`` is the signing key's fingerprint once the signature checked.
    """

    ok: bool
    reason: str
    signer: str | None = None
    pinned: bool = False


def _signature_fields(certificate: Mapping[str, Any]) -> tuple[dict[str, str] | None, str]:
    signature = certificate.get("signature")
    if not isinstance(signature, dict):
        return None, "missing signature"
    for name in ("algorithm", "public_key", "public_key_fingerprint", "value"):
        if not isinstance(signature.get(name), str):
            return None, f"signature.{name} missing or not a string"
    if signature["algorithm"] != SIGNATURE_ALGORITHM:
        return None, f"unsupported signature algorithm {truncate_for_message(signature['algorithm'], 40)}"
    return signature, ""


def _parse(data: bytes) -> tuple[dict[str, Any] | None, str]:
    """The certificate object if ``data`` is exactly its canonical encoding, else why not."""
    try:
        certificate = strict_loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"not valid JSON: {truncate_for_message(str(exc), 160)}"
    if not isinstance(certificate, dict):
        return None, "not a JSON object"
    try:
        canonical = certificate_bytes(certificate)
    except (TypeError, ValueError, RecursionError) as exc:
        return None, f"cannot be put in canonical form: {truncate_for_message(str(exc), 160)}"
    if canonical != data:
        return None, (
            "not in canonical form: the bytes differ from the canonical encoding of their content "
            "(edited or reformatted)"
        )
    return certificate, ""


def check_certificate_bytes(data: bytes, *, trusted_fingerprints: Iterable[str] | None = None) -> Verdict:
    """Check a certificate's bytes. Never raises on bad input.

    ``trusted_fingerprints=None`` checks integrity only (``pinned=False``); an empty list trusts nobody.
    """
    certificate, problem = _parse(data)
    if certificate is None:
        return Verdict(False, problem)
    problems = completeness_problems(certificate)
    if problems:
        return Verdict(False, "fields incomplete: " + "; ".join(problems[:5]))
    signature, problem = _signature_fields(certificate)
    if signature is None:
        return Verdict(False, problem)
    digest = manifest_digest(_body(certificate))
    if certificate.get("manifest_digest") != digest:
        return Verdict(False, "manifest digest mismatch: the certificate content was modified after signing")
    try:
        public_raw = base64.b64decode(signature["public_key"], validate=True)
        signature_raw = base64.b64decode(signature["value"], validate=True)
        public_key = Ed25519PublicKey.from_public_bytes(public_raw)
    except (ValueError, TypeError) as exc:
        return Verdict(False, f"signature or public key is malformed: {truncate_for_message(str(exc), 120)}")
    if (
        base64.b64encode(public_raw).decode("ascii") != signature["public_key"]
        or base64.b64encode(signature_raw).decode("ascii") != signature["value"]
    ):
        return Verdict(False, "signature or public key is not in canonical base64")
    fingerprint = public_key_fingerprint(public_raw)
    if not hmac.compare_digest(signature["public_key_fingerprint"].encode("utf-8"), fingerprint.encode("utf-8")):
        return Verdict(False, "public key does not match its fingerprint")
    try:
        public_key.verify(signature_raw, _signed_message(digest, fingerprint))
    except InvalidSignature:
        return Verdict(False, "signature invalid: not made by this key over this digest")
    if trusted_fingerprints is None:
        return Verdict(
            True,
            f"integrity only: the signature is self-consistent but the signer is NOT verified "
            f"(signed by {fingerprint}, which no pin checked) over {digest}",
            signer=fingerprint,
        )
    if not fingerprint_trusted(fingerprint, list(trusted_fingerprints)):
        return Verdict(False, f"signed by an untrusted key {fingerprint}", signer=fingerprint, pinned=True)
    return Verdict(True, f"valid: Ed25519 signature by pinned key {fingerprint} over {digest}", fingerprint, True)


def verify_certificate_bytes(data: bytes, *, trusted_fingerprints: Iterable[str] | None = None) -> tuple[bool, str]:
    """(ok, reason) of :func:`check_certificate_bytes`. Without pins ``ok`` means integrity only."""
    verdict = check_certificate_bytes(data, trusted_fingerprints=trusted_fingerprints)
    return verdict.ok, verdict.reason


def check_certificate(path: Path | str, *, trusted_fingerprints: Iterable[str] | None = None) -> Verdict:
    """Verify the certificate file at ``path``.

    The file is read with :func:`read_input_file`, so a FIFO, a device such as /dev/zero (or a symlink
    to one) or an oversized file raises InputFileError instead of hanging or filling memory.
    """
    data = read_input_file(path, what="certificate")
    return check_certificate_bytes(data, trusted_fingerprints=trusted_fingerprints)


def verify_certificate(path: Path | str, *, trusted_fingerprints: Iterable[str] | None = None) -> tuple[bool, str]:
    """Verify the certificate file at ``path``; returns (ok, reason). Never raises on a bad file.

    Without ``trusted_fingerprints`` ``ok`` proves integrity only (the reason says the signer is NOT
    verified); callers that decide trust should pin, or use :func:`check_certificate`'s ``pinned``.
    """
    try:
        verdict = check_certificate(path, trusted_fingerprints=trusted_fingerprints)
    except InputFileError as exc:
        return False, str(exc)
    return verdict.ok, verdict.reason
