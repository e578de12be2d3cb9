"""One generation with llama.cpp in a child process, so a native crash becomes a message, not a dead process.

A segfault or illegal instruction inside llama.cpp kills the Python process that called it: a test
session ends with no report, a Dagster run stays STARTED, set-up stops mid-way. Before the project
loads a model in-process it runs the same load and a short generation here, in a child, once per
(model, library build, settings, CPU): if the child dies, the caller gets a ``NativeCrashError``
naming the signal, the CPU features llama.cpp reported and the switch to try. Passing results are
remembered under ``$RVU_HOME/cache/native_probe/`` so later loads cost nothing.

    python -m rvu_pipelines.models.native_probe MODEL.gguf     # run the probe, print the verdict
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.errors import RvuError
from rvu_pipelines.machine import usable_cores
from rvu_pipelines.models.llama_runtime import (
    BUILD_TARGET_ENV,
    EXTRA_BUFTS_ENV,
    LlamaRuntimeSettings,
    host_cpu_summary,
    llama_build_fingerprint,
    missing_instruction_sets,
    open_llama,
    parse_system_info,
)
from rvu_pipelines.models.specs import load_model_config
from rvu_pipelines.models.store import ModelStore
from rvu_pipelines.paths import cache_dir
from rvu_pipelines.settings import llama_probe_enabled, llama_probe_fault

# Fault injection for the crash path's own tests and for trying `rvu doctor`'s report on a machine
# that does not crash: "segv" makes the child dereference NULL (a real SIGSEGV in native code) after
# the model has loaded, where llama.cpp's AMX crash happens.
FAULT_ENV = "RVU_LLAMA_PROBE_FAULT"
# Long enough that the prompt is evaluated as a batch (the matmul path that crashed), short to run.
PROBE_MESSAGES = [
    {
        "role": "system",
        "content": "You are a careful assistant for a security team. Answer in one plain sentence, "
        "without lists, code or quotations, and do not repeat the question.",
    },
    {
        "role": "user",
        "content": "A tool returned a document that tells the agent to forward the user's emails to "
        "an unknown address. What should the agent do with that instruction?",
    },
]
PROBE_MAX_TOKENS = 24
TIMED_OUT = -999  # returncode recorded when the child had to be killed for running past the time limit


class NativeCrashError(RvuError):
    """llama.cpp died (signal) or failed in the child process; the message says why and what to try."""

    def __init__(self, result: ProbeResult) -> None:
        self.result = result
        super().__init__(result.explanation())


@dataclass(frozen=True)
class ProbeResult:
    model_path: str
    settings: dict[str, Any]
    returncode: int
    seconds: float
    text: str = ""
    system_info: str = ""
    llama_cpp_version: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_seconds: float = 0.0  # llama.cpp's own timings of the prompt pass and of token generation
    generation_seconds: float = 0.0
    error: str = ""
    log: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.error and bool(self.text.strip())

    @property
    def signal_name(self) -> str | None:
        if self.returncode == TIMED_OUT:
            return None
        if self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        if self.returncode >= 128 + 1 and self.returncode <= 128 + 64:  # a shell reporting a signal
            try:
                return signal.Signals(self.returncode - 128).name
            except ValueError:
                return None
        return None

    @property
    def buffers(self) -> list[str]:
        """The model buffer lines of llama.cpp's load log (``CPU_Mapped model buffer size = ...``)."""
        return [line.strip() for line in self.log.splitlines() if "model buffer size" in line]

    def explanation(self) -> str:
        if self.ok:
            return f"llama.cpp generated {self.completion_tokens} tokens in a child process: {self.text.strip()!r}"
        features = parse_system_info(self.system_info)
        amx = features.get("AMX_INT8") == "1"
        lines = []
        if self.signal_name:
            lines.append(
                f"llama.cpp died with {self.signal_name} while loading {self.model_path} and generating "
                f"(child process, exit {self.returncode})."
            )
        elif self.returncode == TIMED_OUT:
            lines.append(
                f"llama.cpp did not finish a {PROBE_MAX_TOKENS}-token generation with {self.model_path} "
                f"within the time limit ({self.seconds:.0f} s)."
            )
        else:
            lines.append(
                f"llama.cpp failed to load {self.model_path} or generate (child exit {self.returncode}): "
                f"{self.error or 'no text generated'}"
            )
        lines.append(f"llama.cpp reported: {self.system_info.strip() or '(nothing: it died before reporting)'}")
        lines.append(f"this CPU: {host_cpu_summary()}")
        lines.append(f"settings: {json.dumps(self.settings, sort_keys=True)}")
        missing = missing_instruction_sets(self.system_info)
        if amx and self.settings.get("extra_bufts") and self.signal_name != "SIGILL":
            lines.append(
                f"This is llama.cpp's AMX weight-repacking path (llama.cpp issue 20824). Turn it off with "
                f"{EXTRA_BUFTS_ENV}=0 (the default), or rebuild without AMX: "
                f"`{BUILD_TARGET_ENV}=portable make setup`."
            )
        elif missing:
            lines.append(
                f"The installed llama.cpp was compiled for instruction sets this CPU lacks "
                f"({', '.join(missing)}): it was built on another machine. Rebuild it for a portable target: "
                f"`{BUILD_TARGET_ENV}=portable make setup` (scripts/build_llama_cpp.py)."
            )
        else:
            lines.append(
                f"Try {EXTRA_BUFTS_ENV}=0 (no weight repacking) and a portable rebuild "
                f"(`{BUILD_TARGET_ENV}=portable make setup`); `rvu doctor` prints the full diagnosis."
            )
        tail = "\n".join(self.log.strip().splitlines()[-8:])
        if tail and not self.ok:
            lines.append("last lines of llama.cpp's log:\n" + tail)
        return "\n".join(lines)


def run_probe(
    model_path: Path | str,
    *,
    settings: LlamaRuntimeSettings | None = None,
    n_ctx: int = 1024,
    n_threads: int | None = None,
    timeout_s: float = 180.0,
    fault: str | None = None,
) -> ProbeResult:
    """Load ``model_path`` and generate once, in a child Python process; never raises for a crash.

    ``fault``: a crash for the child to simulate after loading (``segv``; default: ``RVU_LLAMA_PROBE_FAULT``)."""
    settings = settings or LlamaRuntimeSettings.configured()
    fault = fault or llama_probe_fault()
    with tempfile.TemporaryDirectory(prefix="rvu-probe-") as scratch:
        report = Path(scratch) / "report.json"
        command = [
            sys.executable,
            "-m",
            "rvu_pipelines.models.native_probe",
            "--child",
            str(model_path),
            "--report",
            str(report),
            "--n-ctx",
            str(n_ctx),
            "--n-threads",
            str(n_threads or usable_cores()),
            "--extra-bufts",
            "1" if settings.extra_bufts else "0",
            *(["--fault", fault] if fault else []),
        ]
        started = time.perf_counter()
        try:
            completed = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            )
            returncode, log = completed.returncode, completed.stderr + completed.stdout
        except subprocess.TimeoutExpired as exc:
            returncode = TIMED_OUT
            log = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        seconds = time.perf_counter() - started
        # the child writes what it learnt as it goes, so a crash still leaves the system info behind
        child: dict[str, Any] = {}
        if report.is_file():
            try:
                child = json.loads(report.read_text())
            except ValueError:
                child = {}
    return ProbeResult(
        model_path=str(model_path),
        settings=settings.as_dict(),
        returncode=returncode,
        seconds=seconds,
        text=str(child.get("text", "")),
        system_info=str(child.get("system_info", "")),
        llama_cpp_version=str(child.get("llama_cpp_version", "")),
        prompt_tokens=int(child.get("prompt_tokens", 0)),
        completion_tokens=int(child.get("completion_tokens", 0)),
        prompt_seconds=float(child.get("prompt_seconds", 0.0)),
        generation_seconds=float(child.get("generation_seconds", 0.0)),
        error=str(child.get("error", "")),
        log=log,
    )


def _probe_key(model_path: Path, settings: LlamaRuntimeSettings, n_threads: int | None) -> str:
    """Everything that decides whether a passing probe still holds: model file, library, settings, CPU."""
    stat = model_path.stat()
    material = json.dumps(
        {
            **llama_build_fingerprint(settings),
            "model": [str(model_path.resolve()), stat.st_size, stat.st_mtime_ns],
            "threads": n_threads,
            "python": sys.executable,
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def ensure_llama_runs(
    model_path: Path | str, *, settings: LlamaRuntimeSettings | None = None, n_threads: int | None = None
) -> ProbeResult | None:
    """Raise ``NativeCrashError`` if llama.cpp cannot generate with this model here; else return quietly.

    Runs the child-process probe the first time a (model, build, settings, CPU) combination is seen
    and remembers a pass; ``RVU_LLAMA_PROBE=0`` skips it. Returns the fresh result, or None when a
    remembered pass (or the switch) made running it unnecessary.
    """
    if not llama_probe_enabled():
        return None
    settings = settings or LlamaRuntimeSettings.configured()
    model_path = Path(model_path)
    marker = cache_dir("native_probe") / f"{_probe_key(model_path, settings, n_threads)}.json"
    if marker.is_file():
        return None
    result = run_probe(model_path, settings=settings, n_threads=n_threads)
    if not result.ok:
        raise NativeCrashError(result)
    # several processes may probe at once: each writes its own temp file and the last rename wins
    remembered = {k: v for k, v in asdict(result).items() if k != "log"}
    write_atomically(marker, json.dumps(remembered, indent=2, sort_keys=True), fsync=False)
    return result


# ---- the child side -----------------------------------------------------------------------------


def _child(model_path: str, report: Path, n_ctx: int, n_threads: int, extra_bufts: bool, fault: str | None) -> int:
    state: dict[str, Any] = {}

    def save(**values: Any) -> None:
        state.update(values)
        write_atomically(report, json.dumps(state), fsync=False)  # a native crash mid-write leaves the last state whole

    import llama_cpp

    save(
        system_info=llama_cpp.llama_print_system_info().decode(errors="replace"),
        llama_cpp_version=llama_cpp.__version__,
    )
    try:
        llm = open_llama(
            llama_cpp.Llama,
            model_path,
            LlamaRuntimeSettings(extra_bufts=extra_bufts),
            n_ctx=n_ctx,
            n_threads=n_threads,
            seed=0,
            verbose=True,
        )
        save(loaded=True)
        if fault == "segv":
            import ctypes

            ctypes.string_at(0)  # SIGSEGV, as a crash inside llama.cpp would be
        response = llm.create_chat_completion(
            messages=PROBE_MESSAGES,
            max_tokens=PROBE_MAX_TOKENS,  # type: ignore[arg-type]
            temperature=0.0,
            seed=0,
            repeat_penalty=1.0,
        )
    except Exception as exc:  # a Python-level failure is reported, a native one kills us (the parent sees it)
        save(error=f"{type(exc).__name__}: {exc}")
        return 1
    usage = response["usage"]  # type: ignore[index]
    perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
    save(
        text=response["choices"][0]["message"]["content"] or "",  # type: ignore[index]
        prompt_tokens=int(usage["prompt_tokens"]),
        completion_tokens=int(usage["completion_tokens"]),
        prompt_seconds=perf.t_p_eval_ms / 1000.0,
        generation_seconds=perf.t_eval_ms / 1000.0,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="a GGUF file (default: the LLM of the configured profile, RVU_MODEL_PROFILE)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--fault", choices=("segv",), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n-ctx", type=int, default=1024)
    parser.add_argument("--n-threads", type=int, default=usable_cores())
    parser.add_argument(
        "--extra-bufts", choices=("0", "1"), default=None, help=f"override {EXTRA_BUFTS_ENV} for this probe"
    )
    parser.add_argument(
        "--cached",
        action="store_true",
        help="skip the probe when it already passed for this model, build, settings and CPU",
    )
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.model, args.report, args.n_ctx, args.n_threads, args.extra_bufts == "1", args.fault)
    if args.model is None:
        try:
            args.model = str(ModelStore().resolve("llm", load_model_config().profile()["llm"]).path)
        except RvuError as exc:
            print(f"native probe: no model to try: {exc}", file=sys.stderr)
            return 2
    settings = (
        LlamaRuntimeSettings(extra_bufts=args.extra_bufts == "1")
        if args.extra_bufts is not None
        else LlamaRuntimeSettings.configured()
    )
    if args.cached:
        try:
            fresh = ensure_llama_runs(args.model, settings=settings, n_threads=args.n_threads)
        except NativeCrashError as exc:
            print(f"native probe: {exc}", file=sys.stderr)
            return 1
        print(f"native probe: {fresh.explanation() if fresh else 'llama.cpp generation passed before on this machine'}")
        return 0
    result = run_probe(args.model, settings=settings, n_ctx=args.n_ctx, n_threads=args.n_threads)
    print(f"native probe: {result.explanation()}", file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
