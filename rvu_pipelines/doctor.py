"""`rvu doctor`: is this machine able to run the platform, and if not, why and what to change.

Each check returns a ``Check`` (name, passed, detail); nothing here raises for a failed check, so a
user sees every problem at once. The LLM is only ever run in a child process (``native_probe``): a
llama.cpp crash is reported as a failed check with its signal, never as a dead ``rvu`` process.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.cpu_features import host_cpu_flags
from rvu_pipelines.errors import RvuError
from rvu_pipelines.models import ModelStore, load_model_config
from rvu_pipelines.models.llama_runtime import (
    BUILD_TARGET_ENV,
    EXTRA_BUFTS_ENV,
    LlamaRuntimeSettings,
    default_model_params,
    host_cpu_summary,
    installed_build_info,
    missing_instruction_sets,
    parse_system_info,
)
from rvu_pipelines.models.native_probe import run_probe
from rvu_pipelines.paths import project_root
from rvu_pipelines.settings import env_value
from rvu_pipelines.tracking import MlflowTracker


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str
    # a check that informs without judging (e.g. "repacking is on because you asked for it")
    advisory: bool = False


def check_cpu() -> Check:
    flags = host_cpu_flags()
    summary = host_cpu_summary(flags)
    if platform.machine().lower() in ("x86_64", "amd64") and flags and "avx2" not in flags:
        return Check(
            "cpu", True, summary + " (no AVX2: the set-up builds llama.cpp for x86-64-v2, slower)", advisory=True
        )
    return Check("cpu", True, summary)


def check_llama_build() -> Check:
    """The installed llama-cpp-python: version, what set-up built it for, and whether this CPU can run it."""
    try:
        import llama_cpp
    except Exception as exc:  # an ImportError or a failed dlopen of the shared library
        return Check(
            "llama.cpp build", False, f"llama_cpp does not import ({type(exc).__name__}: {exc}); run `make setup`."
        )
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    build = installed_build_info()
    built_for = (
        f"built by set-up for {build.get('target')} / {build.get('level')} (key {build.get('key')})"
        if build
        else "NOT built by scripts/setup.sh (a -march=native build from pip/uv?)"
    )
    detail = f"llama-cpp-python {llama_cpp.__version__}, {built_for}\n{system_info}"
    missing = missing_instruction_sets(system_info, host_cpu_flags())
    if missing:
        return Check(
            "llama.cpp build",
            False,
            detail + f"\ncompiled for {', '.join(missing)}, which this CPU lacks "
            f"(SIGILL): rebuild with `{BUILD_TARGET_ENV}=portable make setup`.",
        )
    amx = parse_system_info(system_info).get("AMX_INT8") == "1"
    if amx:
        detail += "\nthis build contains llama.cpp's AMX kernels (a native build on an AMX host)"
    return Check("llama.cpp build", True, detail, advisory=build is None or amx)


def check_llama_settings() -> Check:
    settings = LlamaRuntimeSettings.configured()
    params = default_model_params(settings)
    detail = (
        f"model parameters passed to llama.cpp: use_extra_bufts={bool(params.use_extra_bufts)} "
        f"({EXTRA_BUFTS_ENV}={env_value(EXTRA_BUFTS_ENV) or '0 (default)'})"
    )
    if settings.extra_bufts:
        detail += "; weight repacking ON: the AMX path is live if the build has it"
    return Check("llama.cpp settings", True, detail, advisory=settings.extra_bufts)


def check_torch() -> Check:
    try:
        import torch
    except Exception as exc:
        return Check("torch", False, f"torch does not import ({type(exc).__name__}: {exc}); run `make setup`.")
    cuda = torch.version.cuda
    detail = (
        f"torch {torch.__version__} ({'CUDA ' + cuda if cuda else 'CPU build'}), "
        f"{torch.get_num_threads()} intra-op threads, {os.cpu_count()} logical cores"
    )
    return Check("torch", True, detail, advisory=bool(cuda))


def check_models() -> list[Check]:
    config = load_model_config()
    checks = []
    try:
        specs = config.profile()
    except RvuError as exc:
        return [Check("models", False, str(exc))]
    store = ModelStore()
    for role, spec in sorted(specs.items()):
        try:
            resolved = store.resolve(role, spec)
        except RvuError as exc:
            checks.append(Check(f"model {role}", False, str(exc)))
            continue
        pin = "pinned, verified" if resolved.pinned else "NOT pinned: add this sha256 to configs/models.yaml"
        checks.append(
            Check(
                f"model {role}",
                True,
                f"{resolved.name} ({config.profile_name()} profile) from {resolved.source}\n"
                f"{resolved.path} ({resolved.size_bytes / 1e6:.1f} MB)\nsha256 {resolved.sha256} ({pin})",
                advisory=not resolved.pinned,
            )
        )
    return checks


def check_generation() -> Check:
    """One generation with the configured LLM, in a child process, with the project's settings."""
    try:
        resolved = ModelStore().resolve("llm", load_model_config().profile()["llm"])
    except RvuError as exc:
        return Check("generation", False, f"no LLM to run: {exc}")
    result = run_probe(resolved.path)
    if not result.ok:
        return Check("generation", False, result.explanation())
    prompt_rate = result.prompt_tokens / result.prompt_seconds if result.prompt_seconds > 0 else 0.0
    generation_rate = result.completion_tokens / result.generation_seconds if result.generation_seconds > 0 else 0.0
    amx = [line for line in result.buffers if "AMX" in line]
    detail = (
        f"{result.text.strip()!r}\n{result.prompt_tokens} prompt tokens at {prompt_rate:.0f} tok/s, "
        f"{result.completion_tokens} generated at {generation_rate:.0f} tok/s; {result.seconds:.1f} s in all "
        "with process start and model load\n"
        f"buffers: {'; '.join(result.buffers) or '(not reported)'}"
    )
    return Check("generation", True, detail, advisory=bool(amx))


def check_mlflow() -> Check:
    tracker = MlflowTracker()
    try:
        from mlflow.tracking import MlflowClient

        experiments = MlflowClient(tracking_uri=tracker.tracking_uri).search_experiments(max_results=100)
    except Exception as exc:  # any backend failure: unreachable server, locked or corrupt SQLite, ...
        return Check(
            "mlflow",
            False,
            f"tracking store {tracker.tracking_uri} not reachable: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. Check MLFLOW_TRACKING_URI.",
        )
    return Check("mlflow", True, f"tracking store {tracker.tracking_uri}: reachable, {len(experiments)} experiment(s)")


def check_dagster_home() -> Check:
    """DAGSTER_HOME set, writable, and an instance Dagster itself can open (asked in a child process).

    Unset, the checkout's .dagster_home/ (where the Makefile points it and set-up creates it) is checked
    instead and the result is advisory: `rvu doctor` run by hand should not fail for what `make` sets."""
    home = env_value("DAGSTER_HOME")
    note = ""
    if not home:
        fallback = project_root() / ".dagster_home"
        if not fallback.is_dir():
            return Check(
                "dagster home",
                False,
                "DAGSTER_HOME is not set: runs would vanish from the UI. The Makefile "
                "sets it to .dagster_home/; outside make, export DAGSTER_HOME=$PWD/.dagster_home.",
            )
        home = str(fallback)
        note = (
            f"DAGSTER_HOME is not set (make sets it); checked {home} instead. "
            f"Outside make: export DAGSTER_HOME={home}. "
        )
    path = Path(home)
    if not path.is_dir():
        return Check("dagster home", False, f"DAGSTER_HOME={home} does not exist: run `make setup` (it creates it).")
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".rvu-doctor-"):
            pass
    except OSError as exc:
        return Check("dagster home", False, f"{note}DAGSTER_HOME={home} is not writable: {exc}")
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster) if dagster.exists() else "dagster", "instance", "info"]
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=120, env={**os.environ, "DAGSTER_HOME": home}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("dagster home", False, f"{note}`dagster instance info` could not run: {exc}")
    if completed.returncode != 0:
        tail = "\n".join((completed.stderr or completed.stdout).strip().splitlines()[-5:])
        return Check("dagster home", False, f"{note}`dagster instance info` failed for DAGSTER_HOME={home}:\n{tail}")
    return Check(
        "dagster home",
        True,
        f"{note}DAGSTER_HOME={home}: writable; `dagster instance info` opens the instance",
        advisory=bool(note),
    )


def run_checks(*, generation: bool = True, progress: Callable[[str], None] | None = None) -> list[Check]:
    steps: list[tuple[str, Callable[[], Check | list[Check]]]] = [
        ("cpu", check_cpu),
        ("llama.cpp build", check_llama_build),
        ("llama.cpp settings", check_llama_settings),
        ("torch", check_torch),
        ("models", check_models),
    ]
    if generation:
        steps.append(("generation", check_generation))
    steps += [("mlflow", check_mlflow), ("dagster home", check_dagster_home)]
    checks: list[Check] = []
    for name, step in steps:
        if progress:
            progress(name)
        try:
            outcome = step()
        except Exception as exc:  # a check must never take the others down with it
            outcome = Check(name, False, f"the check itself failed: {type(exc).__name__}: {exc}")
        checks.extend(outcome if isinstance(outcome, list) else [outcome])
    return checks
