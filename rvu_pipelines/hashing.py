"""sha256 of files and folders, the identity every data set and model is recorded under."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_tree(root: Path) -> str:
    """Digest of a folder: sha256 over sorted 'relative-path<TAB>file-sha256' lines.

    Covers every file (weights, tokenizer, config), so a swapped tokenizer is caught too.
    """
    lines = [
        f"{path.relative_to(root).as_posix()}\t{sha256_file(path)}\n"
        for path in sorted(p for p in root.rglob("*") if p.is_file())
    ]
    return sha256_bytes("".join(lines).encode())


def sha256_path(path: Path) -> str:
    return sha256_tree(path) if path.is_dir() else sha256_file(path)
