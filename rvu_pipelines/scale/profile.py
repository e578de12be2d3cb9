"""The local scale profile: PostgreSQL, MLflow, Dagster webserver + daemon, celery workers, llama.cpp servers.

``rvu scale up`` (``make scale-up``) starts what is not running, ``rvu scale down`` stops all of it, ``rvu scale
status`` says what runs. Everything lives under ``<RVU_HOME>/scale/``: the database cluster, MLflow's artifacts,
the Dagster home (its ``dagster.yaml`` points runs, event log and schedules at PostgreSQL), one log and one pid
file per service, and ``scale.env`` — the variables a shell (or a worker) sources to use the profile:

    source .rvu/scale/scale.env && dagster job launch -j recovery_reproductions_job -m assets.definitions

These are the real engines' own commands (``pg_ctl``, ``mlflow server``, ``dagster-webserver``,
``dagster-daemon``, ``dagster-celery worker``, llama-cpp-python's OpenAI-compatible server); this module only starts
them in the right order with the right settings and stops them.

LLM inference goes through the OpenAI-compatible backend: one llama.cpp server per celery worker (one in all
without celery), each worker pointed at its own, so a step's process holds no model and two workers never
share one llama.cpp context. The servers load the profile's pinned GGUF with the in-process backend's llama.cpp
parameters (``models.llama_server``) and are asked for plain greedy decoding (``repeat_penalty`` 1.0), so a cell
gives the embedded run's text.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.errors import StoreError
from rvu_pipelines.machine import usable_cores
from rvu_pipelines.paths import project_root, state_dir
from rvu_pipelines.scale.dagster_instance import dagster_postgres_url, write_instance
from rvu_pipelines.scale.postgres_server import LocalPostgres

DATABASES = ("dagster", "mlflow", "rvu")
SERVICES = ("postgres", "mlflow", "dagster-webserver", "dagster-daemon")  # plus llm servers, redis, celery workers
# llama.cpp's server defaults to repeat_penalty 1.1; the in-process backend decodes plain greedy (1.0)
GREEDY_EXTRA_BODY = {"repeat_penalty": 1.0}


@dataclass(frozen=True)
class Ports:
    postgres: int = 5433
    mlflow: int = 5001
    dagster: int = 3001
    redis: int = 6380
    llm: int = 8090  # server i listens on llm + i


# what ScaleProfile.environment() sets: a process that must run on the embedded defaults drops these
PROFILE_VARIABLES = (
    "DAGSTER_HOME",
    "MLFLOW_TRACKING_URI",
    "RVU_PROVENANCE_STORE",
    "RVU_EXECUTOR",
    "RVU_CELERY_BROKER",
    "RVU_LLM_BACKEND",
    "RVU_LLM_BASE_URL",
    "RVU_LLM_EXTRA_BODY",
)


def embedded_environment(home: Path, base: dict[str, str]) -> dict[str, str]:
    """``base`` (the caller's environment) set to the embedded defaults rooted at ``home``: state, a SQLite
    Dagster home and MLflow store, in-process steps, llama.cpp in-process; whatever the profile sets is dropped.
    The reference the scale profile's results are compared with (benchmark, fault tests)."""
    env = {k: v for k, v in base.items() if k not in PROFILE_VARIABLES}
    return {
        **env,
        "RVU_HOME": str(home / "state"),
        "DAGSTER_HOME": str(home / "dagster_home"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        "RVU_EXECUTOR": "in_process",
    }


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

    def __init__(
        self,
        root: Path | None = None,
        ports: Ports | None = None,
        workers: int = 2,
        max_concurrent_runs: int = 4,
        llm_servers: bool = True,
    ) -> None:
        """``workers``: celery workers (0: no celery, the multiprocess executor); ``llm_servers``: serve the LLM
        over HTTP, one llama.cpp server per worker; False: each step process loads the model in-process as the
        embedded default does. ``rvu scale`` passes what the RVU_SCALE_* settings say."""
        self.root = (root or state_dir() / "scale").resolve()
        self.max_concurrent_runs = max_concurrent_runs
        self.ports = ports or Ports()
        self.workers = workers
        self.llm_servers = llm_servers
        self.postgres = LocalPostgres(self.root / "postgres", self.ports.postgres)

    @property
    def llm_server_count(self) -> int:
        """One per celery worker (one in all under the multiprocess executor); 0 without servers."""
        return max(1, self.workers) if self.llm_servers else 0

    def llm_url(self, index: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports.llm + index}/v1"

    @property
    def services(self) -> list[str]:
        servers = [f"llm-server-{i}" for i in range(self.llm_server_count)]
        workers = [f"celery-worker-{i}" for i in range(self.workers)]
        return [*SERVICES, *servers, *(["redis", *workers] if self.workers else [])]

    @property
    def broker_url(self) -> str:
        return f"redis://127.0.0.1:{self.ports.redis}/0"

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
        env = {
            "DAGSTER_HOME": str(self.dagster_home),
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "RVU_PROVENANCE_STORE": f"{self.database_url('rvu')}?schema=rvu",
            "RVU_EXECUTOR": "celery" if self.workers else "multiprocess",
        }
        if self.workers:
            env["RVU_CELERY_BROKER"] = self.broker_url
        if self.llm_servers:  # a celery worker's own server replaces llm_url(0) in that worker's environment
            env["RVU_LLM_BACKEND"] = "openai_compatible"
            env["RVU_LLM_BASE_URL"] = self.llm_url(0)
            env["RVU_LLM_EXTRA_BODY"] = json.dumps(GREEDY_EXTRA_BODY, sort_keys=True)
        return env

    def write_env_file(self) -> Path:
        """``scale.env``: ``export`` lines, values shell-quoted (RVU_LLM_EXTRA_BODY is JSON)."""
        lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(self.environment().items()))
        return write_atomically(self.env_file, lines)

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
            "redis": self.broker_url,
            **{f"llm-server-{i}": self.llm_url(i) for i in range(self.llm_server_count)},
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
        for name in self.services[1:]:
            pid = self._pid(name)
            address = addresses.get(name, f"queue dagster on {self.broker_url}")
            states.append(ServiceState(name, pid is not None, pid, address, self._log_file(name)))
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
        write_instance(self.dagster_home, self.database_url("dagster"), max_concurrent_runs=self.max_concurrent_runs)
        self.write_env_file()
        binaries = Path(sys.executable).parent
        # the services' own helpers (dagster-celery runs `celery`) come from this virtual environment
        env = {**os.environ, **self.environment()}
        env["PATH"] = f"{binaries}{os.pathsep}{env.get('PATH', '')}"
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
        if self.llm_server_count:
            self._start_llm_servers(env)
        if self.workers:
            self._start_celery(binaries, env, timeout_s)
        self._wait_http("mlflow", f"{self.mlflow_url}/health", timeout_s)
        self._wait_http("dagster-webserver", f"{self.dagster_url}/server_info", timeout_s)
        for i in range(self.llm_server_count):
            self._wait_http(f"llm-server-{i}", f"{self.llm_url(i)}/models", timeout_s)
        if self.workers:
            self._wait_workers(timeout_s)
        return self.status()

    def _start_llm_servers(self, env: dict[str, str]) -> None:
        """The profile's LLM (configs/models.yaml, sha256-checked) behind llama-cpp-python's OpenAI-compatible
        server, one per worker, the cores split between them (two servers on two cores: one thread each)."""
        from rvu_pipelines.agents.harness import AGENT_N_CTX
        from rvu_pipelines.models import ModelStore, load_model_config
        from rvu_pipelines.models.kv_prefixes import CHUNK_TOKENS

        model = ModelStore().resolve("llm", load_model_config().profile()["llm"])
        threads = max(1, usable_cores() // self.llm_server_count)
        for i in range(self.llm_server_count):
            self._start(
                f"llm-server-{i}",
                [
                    sys.executable,
                    "-m",
                    "rvu_pipelines.models.llama_server",
                    "--model",
                    str(model.path),
                    "--model_alias",
                    model.name,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.ports.llm + i),
                    "--n_ctx",
                    str(max(AGENT_N_CTX, model.n_ctx)),
                    "--n_threads",
                    str(threads),
                    # prompts evaluated in the same chunks as the in-process backend (models.kv_prefixes)
                    "--n_batch",
                    str(CHUNK_TOKENS),
                    "--n_ubatch",
                    str(CHUNK_TOKENS),
                    "--seed",
                    "0",
                ],
                env,
            )

    def _start_celery(self, binaries: Path, env: dict[str, str], timeout_s: float) -> None:
        """Redis as the broker (the OS package's ``redis-server``, no persistence: a queue, not a store) and the
        workers, one step at a time each; every worker imports the code location to run a step."""
        redis = shutil.which("redis-server")
        if redis is None:
            raise StoreError(
                "Celery workers need a broker: install Redis (Debian: apt install redis-server; `make scale-up` does "
                "it as root), or set RVU_SCALE_CELERY_WORKERS=0 to run steps with the multiprocess executor."
            )
        (self.root / "redis").mkdir(exist_ok=True)
        self._start(
            "redis",
            [
                redis,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.ports.redis),
                "--dir",
                str(self.root / "redis"),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            env,
        )
        self._wait_redis(timeout_s)
        config = self.root / "celery.yaml"
        broker = self.broker_url
        write_atomically(config, f"execution:\n  config:\n    broker: {broker}\n    backend: {broker}\n")
        for i in range(self.workers):
            self._start(
                f"celery-worker-{i}",
                [
                    str(binaries / "dagster-celery"),
                    "worker",
                    "start",
                    "-A",
                    "dagster_celery.app",
                    "-n",
                    f"rvu-{i}",
                    "-y",
                    str(config),
                    "--",
                    "--concurrency=1",
                ],
                {**env, "RVU_LLM_BASE_URL": self.llm_url(i)} if self.llm_servers else env,
            )

    def _wait_workers(self, timeout_s: float) -> None:
        """Until every worker answers a celery ping through the broker (each imports the code location first)."""
        from celery import Celery

        app = Celery(broker=self.broker_url, backend=self.broker_url)
        deadline = time.monotonic() + timeout_s
        while True:
            answered = {name for reply in app.control.ping(timeout=2.0) for name in reply}
            if len(answered) >= self.workers:
                return
            dead = [f"celery-worker-{i}" for i in range(self.workers) if self._pid(f"celery-worker-{i}") is None]
            if dead or time.monotonic() >= deadline:
                log = self._log_file(dead[0] if dead else "celery-worker-0")
                raise StoreError(f"{', '.join(dead) or 'the celery workers'} did not come up; see {log}")
            time.sleep(1.0)

    def _wait_redis(self, timeout_s: float) -> None:
        import redis

        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(redis.exceptions.ConnectionError):
                if redis.Redis(host="127.0.0.1", port=self.ports.redis, socket_timeout=2).ping():
                    return
            if self._pid("redis") is None or time.monotonic() >= deadline:
                raise StoreError(f"redis did not come up on port {self.ports.redis}; see {self._log_file('redis')}")
            time.sleep(0.2)

    def _start(self, name: str, command: list[str], env: dict[str, str]) -> None:
        if self._pid(name) is not None:
            return
        log = self._log_file(name).open("ab")
        process = subprocess.Popen(  # noqa: S603 - our own venv's console scripts, no shell
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True
        )
        write_atomically(self._pid_file(name), f"{process.pid}\n", fsync=False)

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
        for name in reversed(self.services[1:]):
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
