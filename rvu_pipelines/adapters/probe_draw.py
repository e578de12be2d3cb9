"""Which probe draw the load gate reads: the published one, or the operator's private one.

The gate's layers read probe prompts and answer items chosen by seeded rules from public data, so an attacker who
knows the code can train an adapter that stays quiet on exactly those (``adapters.gate_aware``). An operator can
keep a secret instead (``gate.probe_draw: private`` in configs/adapters.yaml): a seed in a file only the gate's
user can read, from which ``private_probes.private_lab`` draws the same layers on items the public gate does not
read. Everything the gate judges then comes from that draw: the benign thresholds (a screening table of the
operator's own adapters scored on the draw, ``rvu adapters draw screen``) and the adapters scored on the spot.

Timeline: the operator makes the secret and screens its known-good adapters before any untrusted adapter
arrives; a verdict records the draw's id (a hash of the seed, never the seed), so a certificate says which draw
judged an adapter without saying what it read.

What the secret does not hide: the code, the pools the draw is taken from, and the layers whose items are the same
on every draw (``PrivateDraw.fixed_items``). An attacker who can submit adapters and read verdicts can still probe
the gate as an oracle; the ledger and ``rvu adapters check`` show scores and thresholds to whoever runs them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from rvu_pipelines.adapters.gate import GateConfig, gate_dir
from rvu_pipelines.errors import InputFileError

SECRET_NAME = "probe_draw.secret"
PUBLIC = "public"
# a seed below this is one an attacker could enumerate (draw every candidate, train against all of them)
MIN_SECRET_SEED = 2**32
MAX_SECRET_SEED = 2**63 - 1  # polars' shuffle seed is an unsigned 64-bit integer; 63 bits keep it a plain int
MAX_SECRET_BYTES = 64


@dataclass(frozen=True)
class ProbeDraw:
    """The public draw (no seed) or a private one; the seed is never in the repr, a log line or a verdict."""

    seed: int | None = field(default=None, repr=False)

    @property
    def private(self) -> bool:
        return self.seed is not None

    @property
    def id(self) -> str:
        """``public``, or ``private-`` and 16 hex digits of a hash of the seed: names the draw, hides the seed."""
        if self.seed is None:
            return PUBLIC
        digest = hashlib.sha256(f"rvu adapter gate probe draw\0{self.seed}".encode()).hexdigest()
        return f"private-{digest[:16]}"

    def __str__(self) -> str:
        return self.id


def secret_path(config: GateConfig, state: Path) -> Path:
    """Where the private draw's seed is kept: ``gate.probe_seed_file``, else ``<RVU_HOME>/adapter_gate/``."""
    return Path(config.probe_seed_file).expanduser() if config.probe_seed_file else gate_dir(state) / SECRET_NAME


def new_secret(path: Path, *, rotate: bool = False) -> ProbeDraw:
    """Make a private draw: a random seed written to ``path``, readable by its owner only (0600), created without
    following a link planted at ``path``. An existing secret is kept unless ``rotate`` (a new draw needs its
    screening table again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if rotate and path.is_symlink():
        raise InputFileError(f"{path}: is a symbolic link; remove it, then make the secret again.")
    if rotate and path.exists():
        path.unlink()
    draw = ProbeDraw(MIN_SECRET_SEED + secrets.randbelow(MAX_SECRET_SEED - MIN_SECRET_SEED))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(path, flags, 0o600)
    except FileExistsError:
        raise InputFileError(
            f"{path}: a probe-draw secret is already there; keep it, or pass --rotate to replace it (the draw's "
            "screening table must then be made again with `rvu adapters draw screen`)."
        ) from None
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(f"{draw.seed}\n")
    return draw


def read_secret(path: Path) -> ProbeDraw:
    """The private draw kept at ``path``. Refused, naming the file and the fix: a link, a file others can read or
    write, or anything but one integer in ``[MIN_SECRET_SEED, MAX_SECRET_SEED]``. No message quotes the file."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise InputFileError(
            f"{path}: no probe-draw secret; make one with `rvu adapters draw new` (gate.probe_draw is 'private')."
        ) from None
    except OSError as exc:
        raise InputFileError(f"{path}: the probe-draw secret cannot be opened ({exc.strerror}); is it a link?") from exc
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"{path}: the probe-draw secret is not a regular file.")
        if info.st_mode & 0o077:
            raise InputFileError(
                f"{path}: the probe-draw secret is readable or writable by others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}); `chmod 600 {path}` and, if others may have read it, make a new "
                "one with `rvu adapters draw new --rotate`."
            )
        data = handle.read(MAX_SECRET_BYTES + 1)
    text = data.decode("ascii", errors="replace").strip()
    if len(data) > MAX_SECRET_BYTES or not text.isdigit():
        raise InputFileError(f"{path}: the probe-draw secret is not one integer; make it with `rvu adapters draw new`.")
    seed = int(text)
    if not MIN_SECRET_SEED <= seed <= MAX_SECRET_SEED:
        raise InputFileError(
            f"{path}: the probe-draw seed is outside [2^32, 2^63 - 1]: a small seed can be enumerated by an attacker; "
            "make one with `rvu adapters draw new --rotate`."
        )
    return ProbeDraw(seed)


def configured_draw(config: GateConfig, state: Path) -> ProbeDraw:
    """The draw ``config`` asks for: public, or the private one whose secret is kept for ``state``."""
    if config.probe_draw == PUBLIC:
        return ProbeDraw()
    return read_secret(secret_path(config, state))


def screening_table_path(state: Path, draw: ProbeDraw) -> Path:
    """The screening table a draw's verdicts are judged against: the adapter study's for the public draw, the
    operator's (``rvu adapters draw screen``) for a private one."""
    study = state / "adapter_study"
    return study / "scores.csv" if not draw.private else study / "draws" / draw.id / "scores.csv"
