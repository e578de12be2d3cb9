"""The version of the code that produced a result, recorded on every episode row, cell and MLflow run.

From a git checkout it is the commit; a tracked tree that differs from the commit adds ``-dirty`` and a
hash of the package's .py files (``<commit>-dirty+<hash>``), so two different uncommitted edits never
share a version. Anywhere else (an installed wheel, a container without .git or without git) it is
``sha256:<hash>`` over the package's .py files (sorted relative paths + bytes). Computed once per
process; git runs with a timeout, no prompts and no optional locks, and any git failure falls back to
the hash, so this never hangs and never raises.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
GIT_TIMEOUT_S = 5.0
HASH_CHARS = 16


def package_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 hex over every .py file under ``package_dir``: sorted relative paths, then their bytes."""
    digest = hashlib.sha256()
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    for path in files:
        relative = path.relative_to(package_dir).as_posix().encode()
        data = path.read_bytes()
        digest.update(len(relative).to_bytes(8, "big") + relative)
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def _git(root: Path, *args: str) -> str | None:
    """One git command's stdout, or None on any failure (no git, not a checkout, timeout, refusal)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_version(package_dir: Path = PACKAGE_DIR) -> str | None:
    """``<commit>`` or ``<commit>-dirty+<package hash>`` when the package sits at the top of a git
    checkout (not an installed copy inside some other repository's folder); None otherwise."""
    if shutil.which("git") is None:
        return None
    root = package_dir.parent
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root.resolve():
        return None
    commit = (_git(root, "rev-parse", "--verify", "HEAD") or "").strip()
    if len(commit) < 40:
        return None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if status is None:
        return None
    if status.strip():
        return f"{commit}-dirty+{package_hash(package_dir)[:HASH_CHARS]}"
    return commit


@functools.cache
def code_version() -> str:
    """This process's code version (computed on the first call, then the same string every call)."""
    return git_version() or f"sha256:{package_hash()[:HASH_CHARS]}"
