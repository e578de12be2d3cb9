"""A PostgreSQL server of the machine's own binaries, on loopback, with its data in one folder.

The scale profile's database (Dagster instance, MLflow backend, provenance store) and the tests' throwaway
server are the same thing: ``initdb`` once, ``pg_ctl start``/``stop``. Nothing here is a mock: it runs the
real ``postgres``. PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` (or
``nobody``) account and the data folder is handed to it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.errors import StoreError

SERVICE_ACCOUNTS = ("postgres", "nobody")
DEFAULT_USER = "rvu"


class PostgresUnavailableError(StoreError):
    """The PostgreSQL server binaries (or an account to run them) are not on this machine."""


def find_binary(name: str) -> Path:
    """``initdb`` / ``pg_ctl`` / ``postgres`` from PATH or Debian's versioned folder (newest first)."""
    found = shutil.which(name)
    if found:
        return Path(found)
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        candidate = Path(folder) / name
        if candidate.exists():
            return candidate
    raise PostgresUnavailableError(
        f"PostgreSQL's {name!r} is not on PATH nor under /usr/lib/postgresql/*/bin. Install the server "
        "(Debian: apt install postgresql-15) or point DATABASE_URL at a running server."
    )


def service_account() -> str | None:
    """The account the server runs as when we are root (PostgreSQL refuses root); None when not root."""
    if os.geteuid() != 0:
        return None
    for name in SERVICE_ACCOUNTS:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PostgresUnavailableError(
        f"Running as root and none of the accounts {SERVICE_ACCOUNTS} exists; PostgreSQL cannot run as root."
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class LocalPostgres:
    """One server: ``data_dir`` holds the cluster, ``port`` is on 127.0.0.1, ``user`` is a trusted superuser.

    ``durable=False`` turns fsync off (tests: a crash may lose the cluster, which is thrown away anyway).
    """

    data_dir: Path
    port: int
    user: str = DEFAULT_USER
    durable: bool = True

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(find_binary(args[0])), *args[1:]]
        account = service_account()
        if account is not None:
            command = ["runuser", "-u", account, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if check and result.returncode != 0:
            raise StoreError(
                f"{' '.join(args[:2])} failed (exit {result.returncode}): {(result.stderr or result.stdout).strip()}"
                f"\nserver log: {self.log_file}"
            )
        return result

    def _hand_over(self, path: Path) -> None:
        account = service_account()
        if account is not None:
            entry = pwd.getpwnam(account)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        """Create the cluster (idempotent): UTF-8, trust auth on loopback only, ``user`` as superuser."""
        if self.initialised():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        self._hand_over(self.data_dir)
        account = service_account()
        if (
            account is not None
            and subprocess.run(
                ["runuser", "-u", account, "--", "test", "-w", str(self.data_dir)], check=False
            ).returncode
        ):
            raise PostgresUnavailableError(
                f"The server runs as {account!r} (PostgreSQL refuses root), which cannot reach {self.data_dir}: "
                "put the data folder under a path every user may traverse (chmod o+x on its parents)."
            )
        extra = [] if self.durable else ["--no-sync"]
        self._run("initdb", "-D", str(self.data_dir), "-U", self.user, "-E", "UTF8", "--auth=trust", *extra)

    def running(self) -> bool:
        return (
            self.initialised() and self._run("pg_ctl", "status", "-D", str(self.data_dir), check=False).returncode == 0
        )

    def start(self, timeout_s: float = 60.0) -> None:
        """Start on 127.0.0.1:``port`` (TCP only, no Unix socket) and wait until it accepts connections."""
        self.init()
        if self.running():
            return
        self.log_file.touch()
        self._hand_over(self.log_file)
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories=''"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(
            "pg_ctl",
            "start",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_file),
            "-o",
            options,
            "-w",
            "-t",
            str(int(timeout_s)),
        )
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    message = f"PostgreSQL on port {self.port} did not come up: {exc}; log: {self.log_file}"
                    raise StoreError(message) from exc
                time.sleep(0.2)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back open transactions; ``immediate``: like a crash)."""
        if self.running():
            self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w")

    def create_database(self, name: str) -> str:
        """Create ``name`` if missing; returns its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as connection:
            exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if exists is None:
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)
