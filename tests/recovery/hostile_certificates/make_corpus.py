"""Regenerate the hostile certificate corpus: ``.venv/bin/python tests/recovery/hostile_certificates/make_corpus.py``.

Every file derives from one synthetic, complete certificate body signed by a fixed "operator" key
(fingerprint in ``expected.json``), so the corpus does not depend on recovery's numbers. Run it again
after a certificate format change (CERTIFICATE_VERSION or REQUIRED_FIELDS) and commit the result.
The /dev/zero symlink and the FIFO are made by the test itself (they cannot be committed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rvu_pipelines.recovery.certificate import (
    BODY_KEYS,
    CERTIFICATE_VERSION,
    REQUIRED_FIELDS,
    _raw,
    certificate_bytes,
    manifest_digest,
    sign_certificate,
)
from rvu_pipelines.recovery.signing_keys import SigningKey

HERE = Path(__file__).resolve().parent


def fixed_key(byte: int) -> SigningKey:
    private = Ed25519PrivateKey.from_private_bytes(bytes([byte]) * 32)
    return SigningKey(private_key=private, public_raw=_raw(private.public_key()), folder=HERE)


def synthetic_body() -> dict[str, Any]:
    body: dict[str, Any] = {"version": CERTIFICATE_VERSION, "certificate_type": "rvu-recovery"}
    body["generated_by"] = {"software": "rvu-pipelines", "version": "corpus"}
    for section, fields in REQUIRED_FIELDS.items():
        body[section] = {name: [] for name in fields}
    body["runtime_recovery"]["purged"] = ["m1", "t2"]
    body["runtime_recovery"]["total_purged"] = 2
    body["membership_probe"]["status"] = "not run"
    assert set(body) == set(BODY_KEYS)
    return body


def main() -> None:
    operator, attacker = fixed_key(1), fixed_key(2)
    genuine = sign_certificate(synthetic_body(), operator)
    files: dict[str, bytes] = {"genuine.json": certificate_bytes(genuine)}
    hidden = synthetic_body()
    hidden["runtime_recovery"]["purged"] = []  # hide the purge, re-sign with the attacker's own key
    hidden["runtime_recovery"]["total_purged"] = 0
    files["resigned_by_other_key.json"] = certificate_bytes(sign_certificate(hidden, attacker))
    impersonated = json.loads(files["resigned_by_other_key.json"])
    impersonated["signature"]["public_key_fingerprint"] = operator.fingerprint  # claims the operator's name
    files["claims_pinned_fingerprint.json"] = certificate_bytes(impersonated)
    files["unsigned.json"] = certificate_bytes({k: v for k, v in genuine.items() if k != "signature"})
    files["truncated.json"] = files["genuine.json"][: len(files["genuine.json"]) // 2]
    files["reordered_keys.json"] = (
        json.dumps(dict(reversed(list(genuine.items()))), separators=(",", ":")) + "\n"
    ).encode()
    files["pretty_printed.json"] = (json.dumps(genuine, sort_keys=True, indent=2) + "\n").encode()
    old = synthetic_body()
    old["version"] = 2
    old_signed = {**old, "manifest_digest": manifest_digest(old)}
    old_signed["signature"] = genuine["signature"]
    files["old_version_2.json"] = certificate_bytes(old_signed)
    files["empty.json"] = b""
    files["nan_value.json"] = files["genuine.json"].replace(b'"total_purged":2', b'"total_purged":NaN')
    files["deeply_nested.json"] = b"[" * 50000 + b"]" * 50000 + b"\n"
    files["not_ascii.json"] = files["genuine.json"].replace(b"rvu-recovery", "rvu-r\u00e9covery".encode())
    for name, data in files.items():
        (HERE / name).write_bytes(data)
    expected = {
        "pinned": operator.fingerprint,
        "files": {
            "genuine.json": [0, "valid"],
            "resigned_by_other_key.json": [1, "untrusted key"],
            "claims_pinned_fingerprint.json": [1, "does not match its fingerprint"],
            "unsigned.json": [1, "missing signature"],
            "truncated.json": [1, "not valid JSON"],
            "reordered_keys.json": [1, "not in canonical form"],
            "pretty_printed.json": [1, "not in canonical form"],
            "old_version_2.json": [1, "version 2 is older"],
            "empty.json": [1, "not valid JSON"],
            "nan_value.json": [1, "not valid JSON"],
            "deeply_nested.json": [1, ""],
            "not_ascii.json": [1, "not valid JSON"],
        },
    }
    (HERE / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
