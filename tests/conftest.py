"""Shared fixtures: the real data mirror beside the checkout and an isolated state folder per session."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs one worker per core) each worker gets its own share of the cores,
    so the thread pools sized from the CPU affinity (torch's OpenMP, llama.cpp through ``usable_cores``) do not
    oversubscribe the machine: two workers on two cores each run one thread instead of four spinning."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or not hasattr(os, "sched_setaffinity"):
        return
    cores, index, workers = sorted(os.sched_getaffinity(0)), int(worker[2:]), int(count)
    share = cores[index::workers] if workers <= len(cores) else [cores[index % len(cores)]]
    os.sched_setaffinity(0, share)
    os.environ["OMP_NUM_THREADS"] = str(len(share))  # read when torch first loads, after this module


_pin_xdist_worker()

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RVU_TEST_DATA_MIRROR", REPO_ROOT.parent / "shared" / "data")).resolve()


# ``--fast`` (``make test-fast``): the inner loop skips every test that loads a model, trains one, starts a server
# or rebuilds whole corpora — through one of these fixtures, or in a module listed below — and keeps the rest.
HEAVY_FIXTURES = frozenset(
    "smollm smollm_gguf llama llama_generates tiny_models spectral_model trace small_switch hfer_detector "
    "dequantized hf_base embedder encoder embedded_reference tiny_d2 tiny_d4 d2_deepset nanoguard trained "
    "registered exported production tiny_hub_classifier buried_d4 random_adapter gate_base harness cells matrix "
    "memsad_scan agentpoison_run optimised postgres_server postgres_location base model".split()
)
HEAVY_MODULES = (
    "tests/platform/test_materialize.py",
    "tests/platform/test_definitions.py",
    "tests/platform/test_cli.py",  # doctor and `rvu models check` generate with llama.cpp
    "tests/recovery/test_recovery_cli.py",  # whole recoveries through the command line
    "tests/memory/test_memory_incident_export.py",
    "tests/spectral/test_probe.py",  # grouped cross-validation over a C grid
    # whole corpora rebuilt from the data mirror
    "tests/detectors/test_overdefense.py",
    "tests/detectors/test_detectors_corpora.py",
    "tests/detectors/test_deployment_texts.py",
    "tests/detectors/test_detector_validity.py",
    "tests/agents/test_agentdojo_clock.py",  # every AgentDojo suite's tool traces, twice
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", help="skip tests that load models, train or start servers")


# pytest-xdist (``make test``, ``--dist loadgroup``) hands out whole modules, so a module's fixtures are built once
# on one worker; modules that build the same costly in-process state share a worker, so it is built once too.
SHARED_WORKER = {
    # the over-defense set parses the docstrings of about a thousand installed .py files (cached per process)
    "tests/detectors/test_overdefense.py": "overdefense-set",
    "tests/detectors/test_production_detector.py": "overdefense-set",
    "tests/detectors/test_detectors_assets.py": "overdefense-set",
    "tests/detectors/test_detector_validity.py": "overdefense-set",
    # the memory-poisoning modules that embed StrategyQA / MINJA records share one worker, so one embedding memory
    # (``embedder``, ``study_embeddings``): each record is embedded once
    "tests/memory_poisoning/test_adaptive_attacks.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_attacks.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_baselines.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_hybrid.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_memsad.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_minja_agent.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_poisoning_export.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_retrieval.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_seeds.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_study.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_timeline.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_varied.py": "memory-poisoning-studies",
    "tests/memory_poisoning/test_write_check.py": "memory-poisoning-studies",
    # one memorising adapter (``depot_memoriser``) for the recoveries that evict one
    "tests/adapters/test_adapter_incidents.py": "depot-memoriser",
    "tests/adapters/test_adapter_membership_probe.py": "depot-memoriser",
}
# handed out first, so that no long module starts last while the other worker has nothing left to run (a work
# unit's test count, xdist's own order, says little: one asset test trains five adapters)
LONG_MODULES = (
    "tests/adapters/test_adapter_assets.py",
    "depot-memoriser",
    "overdefense-set",
    "memory-poisoning-studies",
    "tests/agents/test_hfer_defense.py",
    "tests/adapters/test_adapter_files.py",
    "tests/recovery/test_recovery_cli.py",
    "tests/platform/test_dagster_dev.py",
    "tests/platform/test_scale_instance.py",
)


def work_unit_of(nodeid: str) -> str:
    """The unit pytest-xdist hands to one worker: the test's module, or the group it shares a worker with."""
    module = nodeid.split("::", 1)[0]
    return SHARED_WORKER.get(module, module)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without it (``-p no:xdist``) nothing calls it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` with the groups named here: xdist's own ``xdist_group`` marks name the group in the
    test's node id, which pytest 9 no longer lets a plugin rewrite, so every test would be handed out alone and
    each module fixture built again for each test that lands between another module's tests."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedWorkerScheduling(LoadScopeScheduling):
        long_first = False  # set once the work queue has been put in LONG_MODULES order

        def _split_scope(self, nodeid: str) -> str:
            return work_unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.long_first:  # once, when the work queue is first handed out
                for unit in reversed(LONG_MODULES):
                    if unit in self.workqueue:
                        self.workqueue.move_to_end(unit, last=False)
                self.long_first = True
            super()._assign_work_unit(node)

    return SharedWorkerScheduling(config, log)


def _module_of(item: pytest.Item) -> str:
    return Path(str(item.fspath)).resolve().relative_to(REPO_ROOT).as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return
    kept, dropped = [], []
    for item in items:
        heavy = HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        module = _module_of(item)
        materializes = any(word in module.rsplit("/", 1)[-1] for word in ("assets", "materialize", "dagster"))
        (dropped if heavy or materializes or module.startswith(HEAVY_MODULES) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def rvu_in_process() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``rvu ARGS`` run in the test's own process by click's runner, with the console script's commands and
    exit-code policy (``RvuGroup``), but without a new interpreter importing torch and the models' libraries
    again (seconds per call). ``env`` changes the environment for the call (None unsets a variable). An
    exception the CLI lets escape fails the test with its traceback, as the console script would print one."""
    from click.testing import CliRunner

    from rvu_pipelines.cli import cli

    def run(*args: str, env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
        result = CliRunner().invoke(cli, list(args), env=dict(env or {}))
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return subprocess.CompletedProcess(["rvu", *args], result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "SOURCES.md").is_file():
        pytest.fail(
            f"The data mirror is expected at {SHARED_DATA} (../shared/data beside the checkout, "
            "or RVU_TEST_DATA_MIRROR)."
        )
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def _isolated_state(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never write into the developer's .rvu/ or DAGSTER_HOME, nor reach a hub."""
    state = tmp_path_factory.mktemp("rvu_home")
    os.environ["RVU_HOME"] = str(state)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{state / 'mlflow.db'}"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.pop("RVU_MODEL_PROFILE", None)
    os.environ.pop("RVU_MODEL_LLM_PATH", None)
    os.environ.pop("RVU_MODEL_EMBEDDER_PATH", None)
    os.environ["RVU_DATA_MIRROR"] = str(SHARED_DATA)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


@pytest.fixture(scope="session")
def tiny_models():
    """The tiny profile's resolved models (package-shipped SmolLM2 and MiniLM)."""
    from rvu_pipelines.models import ModelStore, load_model_config

    profile = load_model_config().profile("tiny")
    store = ModelStore()
    return {role: store.resolve(role, spec) for role, spec in profile.items()}


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store migrated once per worker: a new store runs MLflow's alembic migrations (seconds),
    a copy of this one takes a tenth of a second and is the same empty store."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(scope="session")
def new_mlflow_store(mlflow_template: Path) -> Callable[[Path], str]:
    """``new_mlflow_store(path)``: a fresh, empty MLflow store at ``path``, returned as its tracking URI."""
    import shutil

    def make(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mlflow_template, path)
        return f"sqlite:///{path}"

    return make


@pytest.fixture(scope="session")
def llama_generates(tiny_models) -> None:
    """llama.cpp can generate on this machine. The check runs in a child process, so a native crash
    (e.g. the AMX path on Sapphire Rapids) fails the tests that need the LLM, with the signal and the
    fix in the message, instead of killing the test session."""
    from rvu_pipelines.models.native_probe import NativeCrashError, ensure_llama_runs

    try:
        ensure_llama_runs(tiny_models["llm"].path)
    except NativeCrashError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def smollm(tiny_models, llama_generates):
    from rvu_pipelines.models import LlamaCppChatModel

    llm = tiny_models["llm"]
    return LlamaCppChatModel(llm.path, n_ctx=llm.n_ctx, name=llm.name)


@pytest.fixture(scope="session")
def postgres_server():
    """A real, throw-away PostgreSQL server (the machine's own binaries) on 127.0.0.1, for the whole session.

    Skips (with the reason) only where the server binaries, or an account to run them as root, are missing."""
    import shutil
    import tempfile

    from rvu_pipelines.scale.postgres_server import LocalPostgres, PostgresUnavailableError, find_binary, free_port

    try:
        find_binary("initdb")
        find_binary("pg_ctl")
    except PostgresUnavailableError as exc:
        pytest.skip(f"no PostgreSQL server binaries on this machine: {exc}")
    root = Path(tempfile.mkdtemp(prefix="rvu-pg-"))
    root.chmod(0o711)  # the server may run as another account (PostgreSQL refuses root)
    server = LocalPostgres(root / "cluster", free_port(), durable=False)
    server.start()
    yield server
    server.stop("immediate")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_location(postgres_server) -> str:
    """A fresh, empty provenance-store location (its own schema) on the session's server."""
    import uuid

    return f"{postgres_server.url('postgres')}?schema=t_{uuid.uuid4().hex[:16]}"


@pytest.fixture(params=["duckdb", "postgres"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each provenance-store test runs on both engines: a DuckDB file and a PostgreSQL schema."""
    if request.param == "duckdb":
        return str(tmp_path / "store.duckdb")
    return str(request.getfixturevalue("postgres_location"))
