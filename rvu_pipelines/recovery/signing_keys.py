"""Ed25519 signing keys and trust for recovery certificates: one key folder per machine, fingerprints
that auditors pin, and trust files.

A key folder holds the private key (0600) and its public key. A key is created only where nothing would
be orphaned by it (:func:`open_signing_key`): a lost key folder next to earlier certificates or recorded
recoveries is an error naming both, never a silent new key. Keys are never logged or printed;
fingerprints and public keys are. Fingerprints are compared in constant time.
"""

from __future__ import annotations

import base64
import hmac
import logging
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.bounded_io import read_input_file
from rvu_pipelines.errors import InputFileError, SigningKeyError
from rvu_pipelines.hashing import sha256_bytes

log = logging.getLogger(__name__)

PRIVATE_KEY_FILE = "ed25519_private.pem"
PUBLIC_KEY_FILE = "ed25519_public.pem"


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


FINGERPRINT_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")
TRUST_FILE_MAX_BYTES = 1 << 20
TRUST_FILE_LIMIT_REASON = (
    "a trust file holds only fingerprints, 72 bytes a line, so 1 MiB is over 14,000 keys; a larger file is not "
    "a trust file: check the path"
)


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
    """Write the public key atomically, so a reader never pins half a file (and a planted link is replaced)."""
    write_atomically(folder / PUBLIC_KEY_FILE, _public_pem(public))


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
    check_signing_key(folder, prior_use=prior_use, new_key=new_key)
    if (folder / PRIVATE_KEY_FILE).exists():
        return load_signing_key(folder)
    return _create_signing_key(folder)


def check_signing_key(key_dir: Path | str, *, prior_use: Sequence[str] = (), new_key: bool = False) -> None:
    """The SigningKeyError :func:`open_signing_key` would raise, raised without reading or creating a key."""
    folder = Path(key_dir)
    if (folder / PRIVATE_KEY_FILE).exists():
        if new_key:
            raise SigningKeyError(
                f"--new-key was given but {folder} already holds a signing key; a key is never replaced. "
                "Drop --new-key to keep using it, or move the folder away first."
            )
        return
    if prior_use and not new_key:
        raise SigningKeyError(
            f"No signing key in {folder}, but earlier recoveries exist ({'; '.join(prior_use)}). The key that "
            f"signed them is missing: restore the key folder {folder} from a backup, or pass --new-key to start "
            "a new key (earlier certificates then verify only against the old key's fingerprint)."
        )


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
    data = read_input_file(
        path, what="trust file", max_bytes=TRUST_FILE_MAX_BYTES, limit_reason=TRUST_FILE_LIMIT_REASON
    )
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
