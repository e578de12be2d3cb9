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

:func:`build_certificate_body` assembles a recovery's body from the store's state through the
:class:`~rvu_pipelines.provenance.store.ProvenanceStore` interface (no SQL here).
"""

from __future__ import annotations

import base64
import hmac
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from rvu_pipelines import __version__
from rvu_pipelines.bounded_io import read_input_file, truncate_for_message
from rvu_pipelines.errors import InputFileError, RvuError, SigningKeyError
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.provenance.canonical import canonical_bytes, strict_loads
from rvu_pipelines.provenance.intsets import union_ints
from rvu_pipelines.recovery.froc import Tier

if TYPE_CHECKING:
    from rvu_pipelines.provenance.incident import IncidentLog
    from rvu_pipelines.provenance.store import ProvenanceStore
    from rvu_pipelines.recovery.contamination import Closures, SeedReport
    from rvu_pipelines.recovery.froc import FrocPolicy, RiskTable
    from rvu_pipelines.recovery.tiers import TierPlan
    from rvu_pipelines.recovery.vector_index import VectorIndex

log = logging.getLogger(__name__)

CERTIFICATE_VERSION = 3
# what changed in each format version, for a clear message on an older certificate
VERSION_CHANGES = {
    2: "version 2 certificates list only this run's actions; version 3 adds the resulting state of every "
    "closure entry, operator restores kept, and closure depth truncation",
}
ENTRY_STATES = ("active", "flagged", "restored", "quarantined", "purged")
KEPT_RESTORED = "kept restored by operator decision"
SIGNATURE_ALGORITHM = "Ed25519"
PRIVATE_KEY_FILE = "ed25519_private.pem"
PUBLIC_KEY_FILE = "ed25519_public.pem"

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


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 key pair loaded from a key folder. ``repr`` never shows the private key.

    ``created`` is True when this call made the key, so callers can say so (a new key is news: earlier
    certificates are signed by another one).
    """

    private_key: Ed25519PrivateKey = field(repr=False)
    public_raw: bytes
    folder: Path
    created: bool = field(default=False, compare=False)

    @property
    def fingerprint(self) -> str:
        return public_key_fingerprint(self.public_raw)

    @property
    def public_b64(self) -> str:
        return base64.b64encode(self.public_raw).decode("ascii")

    @property
    def public_pem(self) -> bytes:
        return _public_pem(self.private_key.public_key())

    def __repr__(self) -> str:
        return f"SigningKey(fingerprint={self.fingerprint!r}, folder={str(self.folder)!r})"


class CertificateOutputError(RvuError):
    """The certificate cannot be written where asked; raised before recovery changes any state."""


FINGERPRINT_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")


def public_key_fingerprint(public_raw: bytes) -> str:
    return "sha256:" + sha256_bytes(public_raw)


def normalize_fingerprint(value: str) -> str:
    """``sha256:<64 hex>`` from what a user typed (bare hex and upper case accepted); ValueError otherwise."""
    text = value.strip().lower()
    if not text.startswith("sha256:"):
        text = "sha256:" + text
    if not FINGERPRINT_PATTERN.fullmatch(text):
        raise ValueError(f"{value.strip()[:80]!r} is not a key fingerprint (sha256: followed by 64 hex digits)")
    return text


def fingerprint_trusted(fingerprint: str, trusted: Iterable[str]) -> bool:
    """Whether ``fingerprint`` equals one of ``trusted``, compared in constant time against every pin."""
    candidate = fingerprint.encode("utf-8")
    matched = False
    for pin in trusted:
        matched |= hmac.compare_digest(candidate, pin.encode("utf-8"))
    return matched


def _public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _write_private_key(path: Path, pem: bytes) -> bool:
    """Create the key file with mode 0600 from the start; False if another process won the race."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _write_public_key(folder: Path, public: Ed25519PublicKey) -> None:
    """Write the public key atomically, so a reader never pins half a file."""
    temp = folder / (PUBLIC_KEY_FILE + ".tmp")
    temp.write_bytes(_public_pem(public))
    os.replace(temp, folder / PUBLIC_KEY_FILE)


def _read_private_key(private_path: Path) -> Ed25519PrivateKey:
    mode = stat.S_IMODE(private_path.stat().st_mode)
    if mode & 0o077:
        raise SigningKeyError(
            f"Signing key {private_path} is readable by others (mode {mode:o}); run `chmod 600 {private_path}`."
        )
    try:
        loaded = serialization.load_pem_private_key(private_path.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise SigningKeyError(f"Signing key {private_path} is not a readable unencrypted PEM key.") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise SigningKeyError(f"Signing key {private_path} is not an Ed25519 key.")
    return loaded


def _read_public_key(path: Path) -> Ed25519PublicKey:
    try:
        public = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError):
        raise SigningKeyError(f"Public key {path} is not a readable PEM public key.") from None
    if not isinstance(public, Ed25519PublicKey):
        raise SigningKeyError(f"Public key {path} is not an Ed25519 key.")
    return public


def _matching_public_file(folder: Path, private: Ed25519PrivateKey) -> None:
    """Recreate a missing public key file from the private key; refuse one that belongs to another key.

    The public file is what this machine pins, so a replaced public file would make it trust a stranger.
    """
    path = folder / PUBLIC_KEY_FILE
    if not path.exists():
        _write_public_key(folder, private.public_key())
        log.info("recreated the public key file %s from the private key", path)
        return
    own = public_key_fingerprint(_raw(private.public_key()))
    found = public_key_fingerprint(_raw(_read_public_key(path)))
    if not hmac.compare_digest(own.encode(), found.encode()):
        raise SigningKeyError(
            f"Key folder {folder} is inconsistent: {path} holds {found} but the private key is {own}. "
            f"Delete {path} to have it recreated from the private key, or restore the folder from a backup."
        )


def load_signing_key(key_dir: Path | str) -> SigningKey:
    """The existing key pair in ``key_dir`` (never creates one); SigningKeyError if there is none."""
    folder = Path(key_dir)
    private_path = folder / PRIVATE_KEY_FILE
    if not private_path.exists():
        raise SigningKeyError(f"No signing key in {folder}: {private_path} does not exist.")
    key = _read_private_key(private_path)
    _matching_public_file(folder, key)
    return SigningKey(private_key=key, public_raw=_raw(key.public_key()), folder=folder)


def _create_signing_key(folder: Path) -> SigningKey:
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SigningKeyError(f"Cannot create the key folder {folder}: {exc.strerror or exc}") from None
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    if not _write_private_key(folder / PRIVATE_KEY_FILE, pem):  # another process created one first: use it
        return load_signing_key(folder)
    _write_public_key(folder, key.public_key())
    raw = _raw(key.public_key())
    log.info("created signing key %s in %s", public_key_fingerprint(raw), folder)
    return SigningKey(private_key=key, public_raw=raw, folder=folder, created=True)


def open_signing_key(key_dir: Path | str, *, prior_use: Sequence[str] = (), new_key: bool = False) -> SigningKey:
    """The key pair in ``key_dir``, or a new one (``created=True``) where none exists.

    ``prior_use`` names what earlier keys signed or recorded (certificates, recoveries in a store): a
    missing key next to those means the key folder was lost, and a silent new key would make every
    earlier certificate fail as "untrusted". That is a SigningKeyError unless ``new_key`` says a new
    key is wanted. ``new_key`` never replaces an existing key.
    """
    folder = Path(key_dir)
    if (folder / PRIVATE_KEY_FILE).exists():
        if new_key:
            raise SigningKeyError(
                f"--new-key was given but {folder} already holds a signing key; a key is never replaced. "
                "Drop --new-key to keep using it, or move the folder away first."
            )
        return load_signing_key(folder)
    if prior_use and not new_key:
        raise SigningKeyError(
            f"No signing key in {folder}, but earlier recoveries exist ({'; '.join(prior_use)}). The key that "
            f"signed them is missing: restore the key folder {folder} from a backup, or pass --new-key to start "
            "a new key (earlier certificates then verify only against the old key's fingerprint)."
        )
    return _create_signing_key(folder)


def load_or_create_signing_key(key_dir: Path | str) -> SigningKey:
    """The key pair in ``key_dir``; generated on first use (private key mode 0600, folder 0700)."""
    return open_signing_key(key_dir)


def trusted_fingerprint(key_dir: Path | str) -> str | None:
    """This machine's key fingerprint for pinning: from the private key when there is one (and the public
    file is then recreated if missing), else from a lone public key file; None when the folder has neither.
    """
    folder = Path(key_dir)
    if (folder / PRIVATE_KEY_FILE).exists():
        return load_signing_key(folder).fingerprint
    public_path = folder / PUBLIC_KEY_FILE
    if public_path.exists():
        return public_key_fingerprint(_raw(_read_public_key(public_path)))
    return None


def public_key_info(key_dir: Path | str) -> tuple[str, bytes] | None:
    """(fingerprint, public key PEM) of the key in ``key_dir`` for ``rvu keys``; None when there is none.

    Never touches the private key's bytes beyond deriving its public half.
    """
    folder = Path(key_dir)
    if (folder / PRIVATE_KEY_FILE).exists():
        key = load_signing_key(folder)
        return key.fingerprint, key.public_pem
    public_path = folder / PUBLIC_KEY_FILE
    if public_path.exists():
        public = _read_public_key(public_path)
        return public_key_fingerprint(_raw(public)), _public_pem(public)
    return None


def read_trust_file(path: Path | str) -> list[str]:
    """Fingerprints in a trust file: one per line, ``#`` starts a comment; InputFileError naming a bad line."""
    data = read_input_file(path, what="trust file", max_bytes=1 << 20)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputFileError(f"trust file {path}: not UTF-8 text.") from None
    pins: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        value = line.split("#", 1)[0].strip()
        if not value:
            continue
        try:
            pins.append(normalize_fingerprint(value))
        except ValueError as exc:
            raise InputFileError(f"trust file {path}:{number}: {exc}.") from None
    return pins


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
    """Write atomically (temp file + rename) so a reader never sees half a certificate."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    temp.write_bytes(certificate_bytes(certificate))
    os.replace(temp, path)
    return path


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


# ------------------------------------------------------------------------------------ the body of a recovery


def _fmt(value: float) -> float:
    return round(float(value), 6)


def entry_state(tainted: bool, quarantined: bool, purged: bool, restored: bool) -> str:
    """One entry's state, the most severe that holds: purged > quarantined > restored > flagged > active."""
    if purged:
        return "purged"
    if quarantined:
        return "quarantined"
    if restored:
        return "restored"
    return "flagged" if tainted else "active"


def resulting_state(
    store: ProvenanceStore, seqs: np.ndarray, entry_ids: Sequence[str], restored: Iterable[int]
) -> dict[str, Any]:
    """Each entry's state read back from the store (not from the plan), plus a count per state."""
    lifted = {int(seq) for seq in restored}
    states = store.entry_states(seqs)
    entries = {
        entry_id: entry_state(bool(t), bool(q), bool(p), int(seq) in lifted)
        for entry_id, seq, t, q, p in zip(
            entry_ids, seqs.tolist(), states["tainted"], states["quarantined"], states["purged"], strict=True
        )
    }
    counts = dict.fromkeys(ENTRY_STATES, 0)
    for state in entries.values():
        counts[state] += 1
    return {"entries": dict(sorted(entries.items())), "counts": counts}


def build_certificate_body(
    store: ProvenanceStore,
    index: VectorIndex | None,
    incident: IncidentLog,
    policy: FrocPolicy,
    detector: Mapping[str, str],
    seeds: SeedReport,
    closures: Closures,
    risk: RiskTable,
    plan: TierPlan,
    probe: Mapping[str, Any],
    gate: Mapping[str, Any],
    *,
    restored: Iterable[int] = (),
    kept_restored: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The unsigned certificate: a pure function of the incident, the store's state and the policy.

    ``detector`` is the certificate's detector section, ``{"name": ..., "version": ...}``.
    ``runtime_recovery.flagged`` / ``quarantined`` / ``purged`` are this run's *actions* (the tier plan,
    less what ``kept_restored`` kept: entry id -> the operator's recorded reason); ``resulting_state``
    is what the store holds for each closure entry after the tiers (``restored``: entry seqs whose
    quarantine an operator lifted), so an earlier run's purge or quarantine is never hidden.
    """
    graph_ids = store.entry_ids
    closure_ids = graph_ids(closures.v2.members)
    closure_v1_ids = graph_ids(closures.v1.members)
    tier_of = {int(seq): Tier(int(tier)) for seq, tier in zip(risk.seqs.tolist(), risk.tier.tolist(), strict=True)}
    id_of = dict(zip(closures.v2.members.tolist(), closure_ids, strict=True))
    states = store.entry_states(closures.v2.members)
    state_lines = sorted(
        f"{id_of[int(seq)]}\t{int(t)}\t{int(q)}\t{int(p)}"
        for seq, t, q, p in zip(
            closures.v2.members.tolist(), states["tainted"], states["quarantined"], states["purged"], strict=True
        )
    )
    isolated = union_ints(plan.quarantine, plan.purge)
    retrievable = int(index.contains(isolated).sum()) if index is not None and isolated.size else 0
    manifest = [
        {
            "entry_id": row.entry_id,
            "content_hash": row.content_hash,
            "action_type": row.action_type,
            "active_adapter_id": row.active_adapter_id,
            "tier": tier_of[row.seq].label,
        }
        for row in sorted(store.manifest(closures.v2.members), key=lambda row: row.entry_id)
    ]
    risk_entries = {
        entry_id: {
            "score": _fmt(score),
            "tier": Tier(int(tier)).label,
            "contamination": _fmt(p),
            "influence": _fmt(i),
            "closure_size": int(size),
        }
        for entry_id, score, tier, p, i, size in zip(
            graph_ids(risk.seqs),
            risk.score.tolist(),
            risk.tier.tolist(),
            risk.contamination.tolist(),
            risk.influence.tolist(),
            risk.closure_size.tolist(),
            strict=True,
        )
    }
    # adapters: the ones this incident loaded or used, plus every adapter the closure tainted
    incident_adapter_ids = {r.adapter_id for r in incident.records if r.adapter_id} | {
        r.active_adapter_id for r in incident.records if r.active_adapter_id
    }
    tainted_set = set(closures.v2.tainted_adapters.tolist())
    evict_set = set(plan.evict_adapters.tolist())
    adapters = []
    for row in store.adapters():
        if row.adapter_id not in incident_adapter_ids and row.seq not in tainted_set:
            continue
        evicted = row.seq in evict_set or row.purged
        adapters.append(
            {
                "adapter_id": row.adapter_id,
                "adapter_name": row.adapter_name,
                "adapter_hash": row.adapter_hash,
                "source": row.source,
                "fused": row.fused,
                "tainted": row.seq in tainted_set or row.tainted,
                "status": "evicted" if evicted else "retained",
                "influence": _fmt(row.influence or 0.0),
            }
        )
    adapters.sort(key=lambda item: str(item["adapter_id"]))
    fusion_warnings = [
        {
            "adapter_id": a["adapter_id"],
            "warning": "adapter was fused into the base weights; unloading cannot remove its contribution",
        }
        for a in adapters
        if a["fused"] and (a["tainted"] or a["status"] == "evicted")
    ]
    kept = dict(kept_restored or {})
    flagged_ids = sorted(graph_ids(plan.flag))
    quarantined_ids = sorted(graph_ids(plan.quarantine))
    purged_ids = sorted(graph_ids(plan.purge))
    return {
        "version": CERTIFICATE_VERSION,
        "certificate_type": "rvu-recovery",
        "generated_by": {"software": "rvu-pipelines", "version": __version__},
        "incident": {
            "incident_id": incident.incident_id,
            "sha256": incident.sha256,
            "records": len(incident.records),
            "episodes": incident.episodes,
            "last_timestamp": _fmt(incident.last_timestamp),
        },
        "policy": policy.summary(),
        "detector": {"name": detector["name"], "version": detector["version"]},
        "runtime_recovery": {
            "seed_ids": sorted(seeds.entry_ids),
            "seeds": [
                {"entry_id": e, "score": _fmt(seeds.scores[e]), "sources": sorted(seeds.sources[e])}
                for e in sorted(seeds.entry_ids)
            ],
            "closure_ids": sorted(closure_ids),
            "closure_v1_ids": sorted(closure_v1_ids),
            "closure_size": len(closure_ids),
            "closure_v1_size": len(closure_v1_ids),
            "adapter_expansion_gain": len(closure_ids) - len(closure_v1_ids),
            "flagged": flagged_ids,
            "quarantined": quarantined_ids,
            "purged": purged_ids,
            "total_flagged": len(flagged_ids),
            "total_quarantined": len(quarantined_ids),
            "total_purged": len(purged_ids),
            "manifest_entries": manifest,
            "tier_counts": risk.counts(),
            "state_digest": "sha256:" + sha256_bytes("\n".join(state_lines).encode()),
            "index": {"isolated_vectors_retrievable": retrievable},
            "resulting_state": resulting_state(store, closures.v2.members, closure_ids, restored),
            "kept_restored": [
                {"entry_id": entry_id, "decision": KEPT_RESTORED, "reason": kept[entry_id]} for entry_id in sorted(kept)
            ],
            "truncated_at_depth": closures.v2.max_depth if closures.v2_beyond else None,
            "entries_beyond_depth": closures.v2_beyond,
        },
        "adapter_attestation": {
            "adapters": adapters,
            "tainted": sorted(store.adapter_ids(closures.v2.tainted_adapters)),
            "evicted": sorted(a["adapter_id"] for a in adapters if a["status"] == "evicted"),
            "retained": sorted(a["adapter_id"] for a in adapters if a["status"] == "retained"),
            "fusion_warnings": fusion_warnings,
            "gate": dict(gate),
        },
        "risk_scores": {"entries": risk_entries, "total_entries": risk.total_entries},
        "membership_probe": dict(probe),
    }
