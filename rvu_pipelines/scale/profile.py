"""The local scale profile: PostgreSQL, an MLflow tracking server, the Dagster webserver and daemon, on loopback.

``rvu scale up`` (``make scale-up``) starts what is not running, ``rvu scale down`` stops all of it, ``rvu scale
status`` says what runs. Everything lives under ``<RVU_HOME>/scale/``: the database cluster, MLflow's artifacts,
the Dagster home (its ``dagster.yaml`` points runs, event log and schedules at PostgreSQL), one log and one pid
file per service, and ``scale.env`` — the variables a shell (or a worker) sources to use the profile:

    source .rvu/scale/scale.env && dagster job launch -j recovery_reproductions_job -m rvu_pipelines.definitions

These are the real engines' own commands (``pg_ctl``, ``mlflow server``, ``dagster-webserver``,
``dagster-daemon``); this module only starts them in the right order with the right settings and stops them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.errors import ConfigError, StoreError
from rvu_pipelines.paths import project_root, state_dir
from rvu_pipelines.scale.dagster_instance import dagster_postgres_url, write_instance
from rvu_pipelines.scale.postgres_server import LocalPostgres
from rvu_pipelines.settings import env_value

DATABASES = ("dagster", "mlflow", "rvu")
SERVICES = ("postgres", "mlflow", "dagster-webserver", "dagster-daemon")


@dataclass(frozen=True)
class Ports:
    postgres: int = 5433
    mlflow: int = 5001
    dagster: int = 3001

    @classmethod
    def from_settings(cls) -> Ports:
        def port(name: str, default: int) -> int:
            raw = env_value(name) or str(default)
            if not raw.isdigit() or not 1024 <= int(raw) <= 65535:
                raise ConfigError(f"{name}={raw!r}: give a port number between 1024 and 65535.")
            return int(raw)

        return cls(
            port("RVU_SCALE_POSTGRES_PORT", cls.postgres),
            port("RVU_SCALE_MLFLOW_PORT", cls.mlflow),
            port("RVU_SCALE_DAGSTER_PORT", cls.dagster),
        )


@dataclass(frozen=True)
class ServiceState:
    name: str
    running: bool
    pid: int | None
    address: str
    log: Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie child of ours is not running
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    return True


class ScaleProfile:
    """The services of the local scale profile, rooted at ``root`` (default ``<RVU_HOME>/scale``)."""

    def __init__(self, root: Path | None = None, ports: Ports | None = None) -> None:
        self.root = (root or state_dir() / "scale").resolve()
        self.ports = ports or Ports.from_settings()
        self.postgres = LocalPostgres(self.root / "postgres", self.ports.postgres)

    # ---------------------------------------------------------------- where things are

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster_home"

    @property
    def env_file(self) -> Path:
        return self.root / "scale.env"

    def database_url(self, name: str) -> str:
        return self.postgres.url(name)

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.mlflow}"

    @property
    def dagster_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.dagster}"

    def environment(self) -> dict[str, str]:
        """What a process needs to use the profile (also written to ``scale.env``)."""
        return {
            "DAGSTER_HOME": str(self.dagster_home),
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "RVU_PROVENANCE_STORE": f"{self.database_url('rvu')}?schema=rvu",
            "RVU_EXECUTOR": "multiprocess",
        }

    def _pid_file(self, name: str) -> Path:
        return self.root / "run" / f"{name}.pid"

    def _log_file(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    # ---------------------------------------------------------------- status

    def _pid(self, name: str) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            pid = int(self._pid_file(name).read_text().strip())
            return pid if _alive(pid) else None
        return None

    def status(self) -> list[ServiceState]:
        addresses = {
            "postgres": self.database_url("rvu"),
            "mlflow": self.mlflow_url,
            "dagster-webserver": self.dagster_url,
            "dagster-daemon": str(self.dagster_home),
        }
        states = [
            ServiceState(
                "postgres",
                self.postgres.running(),
                None,
                addresses["postgres"],
                self.postgres.log_file,
            )
        ]
        for name in SERVICES[1:]:
            pid = self._pid(name)
            states.append(ServiceState(name, pid is not None, pid, addresses[name], self._log_file(name)))
        return states

    # ---------------------------------------------------------------- up / down

    def up(self, timeout_s: float = 180.0) -> list[ServiceState]:
        """Start whatever is not running (idempotent): PostgreSQL and its databases, MLflow, Dagster."""
        for folder in (self.root, self.root / "run", self.root / "logs", self.root / "mlartifacts"):
            folder.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)  # the database server may run as another account (PostgreSQL refuses root)
        self.postgres.start(timeout_s)
        for name in DATABASES:
            self.postgres.create_database(name)
        write_instance(self.dagster_home, self.database_url("dagster"))
        self.env_file.write_text("".join(f"export {k}={v}\n" for k, v in sorted(self.environment().items())))
        binaries = Path(sys.executable).parent
        env = {**os.environ, **self.environment()}
        self._start(
            "mlflow",
            [
                str(binaries / "mlflow"),
                "server",
                "--backend-store-uri",
                dagster_postgres_url(self.database_url("mlflow")),
                "--artifacts-destination",
                str(self.root / "mlartifacts"),
                "--serve-artifacts",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.ports.mlflow),
                "--workers",
                "1",
            ],
            env,
        )
        workspace = str(project_root() / "workspace.yaml")
        self._start(
            "dagster-webserver",
            [str(binaries / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(self.ports.dagster), "-w", workspace],
            env,
        )
        self._start("dagster-daemon", [str(binaries / "dagster-daemon"), "run", "-w", workspace], env)
        self._wait_http("mlflow", f"{self.mlflow_url}/health", timeout_s)
        self._wait_http("dagster-webserver", f"{self.dagster_url}/server_info", timeout_s)
        return self.status()

    def _start(self, name: str, command: list[str], env: dict[str, str]) -> None:
        if self._pid(name) is not None:
            return
        log = self._log_file(name).open("ab")
        process = subprocess.Popen(  # noqa: S603 - our own venv's console scripts, no shell
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True
        )
        self._pid_file(name).write_text(f"{process.pid}\n")

    def _wait_http(self, name: str, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback health check
                    if response.status == 200:
                        return
            if self._pid(name) is None:
                raise StoreError(f"{name} exited while starting; see {self._log_file(name)}")
            if time.monotonic() >= deadline:
                raise StoreError(f"{name} did not answer {url} within {timeout_s:.0f} s; see {self._log_file(name)}")
            time.sleep(0.5)

    def down(self, timeout_s: float = 30.0) -> None:
        """Stop every service (the daemon and webserver first, PostgreSQL last); idempotent."""
        for name in reversed(SERVICES[1:]):
            pid = self._pid(name)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout_s
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if _alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
            self._pid_file(name).unlink(missing_ok=True)
        self.postgres.stop()
