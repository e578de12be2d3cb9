"""V2 recovery certificates (seed 000 §3.8, Theorem 4): canonical JSON, SHA-256 digest, Ed25519 signature.

The paper's code "signs" with a bare SHA-256, which proves nothing to an auditor: anyone who edits the file
can recompute it. Here the digest covers the certificate body and an Ed25519 signature covers the
digest and the signer's key fingerprint, so an edit is caught unless the editor holds the private key.
An auditor pins the fingerprint (``trusted_fingerprints``); without a pin, :func:`verify_certificate`
checks integrity and reports which key signed.

Byte-level rules: the file is exactly ``canonical_json(certificate) + "\\n"`` (sorted keys, no
whitespace, ASCII, floats with six decimals), so changing any byte either breaks the JSON, breaks the
canonical form, or changes a value the digest covers. The same incident and key give the same bytes:
Ed25519 signatures are deterministic and the body holds no wall-clock time or path.

:func:`build_certificate_body` assembles a recovery's body from the store's state through the
:class:`~rvu_pipelines.provenance.store.ProvenanceStore` interface (no SQL here).
"""

from __future__ import annotations

import base64
import logging
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from rvu_pipelines import __version__
from rvu_pipelines.errors import SigningKeyError
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

CERTIFICATE_VERSION = 2
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
    ),
    "adapter_attestation": ("adapters", "tainted", "evicted", "retained", "fusion_warnings", "gate"),
    "risk_scores": ("entries", "total_entries"),
    "membership_probe": ("status",),
}
BODY_KEYS = ("version", "certificate_type", "generated_by", *REQUIRED_FIELDS)


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 key pair loaded from a key folder. ``repr`` never shows the private key."""

    private_key: Ed25519PrivateKey
    public_raw: bytes
    folder: Path

    @property
    def fingerprint(self) -> str:
        return public_key_fingerprint(self.public_raw)

    @property
    def public_b64(self) -> str:
        return base64.b64encode(self.public_raw).decode("ascii")

    def __repr__(self) -> str:
        return f"SigningKey(fingerprint={self.fingerprint!r}, folder={str(self.folder)!r})"


def public_key_fingerprint(public_raw: bytes) -> str:
    return "sha256:" + sha256_bytes(public_raw)


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


def load_or_create_signing_key(key_dir: Path | str) -> SigningKey:
    """The key pair in ``key_dir``; generated on first use (private key mode 0600, folder 0700)."""
    folder = Path(key_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SigningKeyError(f"Cannot create the key folder {folder}: {exc}") from exc
    private_path = folder / PRIVATE_KEY_FILE
    if not private_path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        if _write_private_key(private_path, pem):
            public_pem = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            (folder / PUBLIC_KEY_FILE).write_bytes(public_pem)
            raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            log.info("generated a new Ed25519 signing key in %s (fingerprint %s)", folder, public_key_fingerprint(raw))
    mode = stat.S_IMODE(private_path.stat().st_mode)
    if mode & 0o077:
        raise SigningKeyError(
            f"Signing key {private_path} is readable by others (mode {mode:o}); run `chmod 600 {private_path}`."
        )
    try:
        loaded = serialization.load_pem_private_key(private_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"Signing key {private_path} is not a readable unencrypted PEM key.") from exc
    if not isinstance(loaded, Ed25519PrivateKey):
        raise SigningKeyError(f"Signing key {private_path} is not an Ed25519 key.")
    key = loaded
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey(private_key=key, public_raw=raw, folder=folder)


def trusted_fingerprint(key_dir: Path | str) -> str | None:
    """Fingerprint of the public key in ``key_dir`` (for pinning in ``verify_certificate``), if present."""
    path = Path(key_dir) / PUBLIC_KEY_FILE
    if not path.exists():
        return None
    public = serialization.load_pem_public_key(path.read_bytes())
    if not isinstance(public, Ed25519PublicKey):
        return None
    return public_key_fingerprint(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


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


def completeness_problems(certificate: Mapping[str, Any]) -> list[str]:
    """Missing or mistyped sections and fields; empty when complete."""
    problems: list[str] = []
    if certificate.get("version") != CERTIFICATE_VERSION:
        problems.append(f"version must be {CERTIFICATE_VERSION}, found {certificate.get('version')!r}")
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


def verify_certificate_bytes(data: bytes, *, trusted_fingerprints: Iterable[str] | None = None) -> tuple[bool, str]:
    """Check a certificate's bytes; returns (ok, reason). Never raises on bad input."""
    try:
        text = data.decode("ascii")
        certificate = strict_loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        return False, f"not valid JSON: {exc}"
    if not isinstance(certificate, dict):
        return False, "not a JSON object"
    try:
        canonical = certificate_bytes(certificate)
    except (TypeError, ValueError) as exc:
        return False, f"cannot be put in canonical form: {exc}"
    if canonical != data:
        return (
            False,
            "not in canonical form: the bytes differ from the canonical encoding of their content "
            "(edited or reformatted)",
        )
    problems = completeness_problems(certificate)
    if problems:
        return False, "fields incomplete: " + "; ".join(problems[:5])
    signature = certificate.get("signature")
    if not isinstance(signature, dict):
        return False, "missing signature"
    for name in ("algorithm", "public_key", "public_key_fingerprint", "value"):
        if not isinstance(signature.get(name), str):
            return False, f"signature.{name} missing or not a string"
    if signature["algorithm"] != SIGNATURE_ALGORITHM:
        return False, f"unsupported signature algorithm {signature['algorithm']!r}"
    digest = manifest_digest(_body(certificate))
    if certificate.get("manifest_digest") != digest:
        return False, "manifest digest mismatch: the certificate content was modified after signing"
    try:
        public_raw = base64.b64decode(signature["public_key"], validate=True)
        signature_raw = base64.b64decode(signature["value"], validate=True)
        public_key = Ed25519PublicKey.from_public_bytes(public_raw)
    except (ValueError, TypeError) as exc:
        return False, f"signature or public key is malformed: {exc}"
    if (
        base64.b64encode(public_raw).decode("ascii") != signature["public_key"]
        or base64.b64encode(signature_raw).decode("ascii") != signature["value"]
    ):
        return False, "signature or public key is not in canonical base64"
    fingerprint = public_key_fingerprint(public_raw)
    if signature["public_key_fingerprint"] != fingerprint:
        return False, "public key does not match its fingerprint"
    try:
        public_key.verify(signature_raw, _signed_message(digest, fingerprint))
    except InvalidSignature:
        return False, "signature invalid: not made by this key over this digest"
    if trusted_fingerprints is not None and fingerprint not in set(trusted_fingerprints):
        return False, f"signed by an untrusted key {fingerprint}"
    return True, f"valid: Ed25519 signature by {fingerprint} over {digest}"


def verify_certificate(path: Path | str, *, trusted_fingerprints: Iterable[str] | None = None) -> tuple[bool, str]:
    """Verify the certificate file at ``path``; returns (ok, reason). Never raises on a bad file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return False, f"cannot read {path}: {exc.strerror or exc}"
    return verify_certificate_bytes(data, trusted_fingerprints=trusted_fingerprints)


# ------------------------------------------------------------------------------------ the body of a recovery


def _fmt(value: float) -> float:
    return round(float(value), 6)


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
) -> dict[str, Any]:
    """The unsigned v2 certificate: a pure function of the incident, the store's state and the policy.

    ``detector`` is the certificate's detector section, ``{"name": ..., "version": ...}``.
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
