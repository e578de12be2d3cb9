#!/usr/bin/env python3
"""Build llama-cpp-python once per CPU *target*, never per build host, and cache the wheel by its flags.

Why this exists: llama-cpp-python compiles llama.cpp with ``-march=native`` by default. A
wheel built that way (a) carries the AMX matmul kernel when the build host has AMX, and that kernel
segfaults on Sapphire Rapids-class CPUs (llama.cpp issue 20824), and (b) is tied to the build host's
instruction set, yet uv caches it under a key that knows nothing of the CPU, so a cache restored on
another machine can die with SIGILL.

So the default target is *portable*: x86-64-v3 (AVX2, FMA, F16C, BMI2: every x86-64 CPU since
2013-2015) with AVX-512 and AMX compiled out, which runs the same on every such CPU whatever the build
host had. Older x86-64 CPUs get x86-64-v2 (SSE4.2); other architectures get the compiler's generic
target. ``RVU_LLAMA_CPU=native`` brings back ``-march=native`` (AVX-512 and AMX where the host has
them); its cache key then includes this host's CPU flags, so such a wheel is never reused elsewhere.

The wheel lands in ``$RVU_WHEEL_CACHE`` (default ``~/.cache/rvu/wheels``) under a directory named by
the sha256 of everything that shapes the binary (version, target, CMake arguments, compiler, Python
tag), with ``build-info.json`` beside it. Only the standard library is used: this runs before the
project's dependencies are installed.

    python scripts/build_llama_cpp.py plan     # print the plan (JSON) without building
    python scripts/build_llama_cpp.py key      # print the level and key that name the build
    python scripts/build_llama_cpp.py wheel    # print the path of the wheel, building it if needed
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rvu_pipelines.cpu_features import host_cpu_flags, x86_64_level  # noqa: E402  (stdlib only)

CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
TARGETS = ("portable", "native")

# The ISA switches of ggml that a portable build sets explicitly (everything not ON is OFF).
GGML_X86_SWITCHES = (
    "GGML_SSE42",
    "GGML_AVX",
    "GGML_AVX_VNNI",
    "GGML_AVX2",
    "GGML_BMI2",
    "GGML_FMA",
    "GGML_F16C",
    "GGML_AVX512",
    "GGML_AVX512_VBMI",
    "GGML_AVX512_VNNI",
    "GGML_AVX512_BF16",
    "GGML_AMX_TILE",
    "GGML_AMX_INT8",
    "GGML_AMX_BF16",
)
GGML_X86_ON = {
    "x86-64-v3": {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C"},
    "x86-64-v2": {"GGML_SSE42"},
    "x86-64": set(),
}
# Not needed by the project (no multimodal models) and a large share of the compile time.
COMMON_CMAKE_ARGS = ("-DLLAVA_BUILD=OFF", "-DGGML_CCACHE=OFF")


def llama_cpp_python_version() -> str:
    """The pinned version, read from requirements/constraints.txt (the single source of pins)."""
    match = re.search(r"^llama-cpp-python==(\S+)$", CONSTRAINTS.read_text(), flags=re.MULTILINE)
    if not match:
        raise SystemExit(f"{CONSTRAINTS}: no 'llama-cpp-python==<version>' pin found; add one.")
    return match.group(1)


def compiler_version() -> str:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return f"{compiler} (version unknown)"
    return out.splitlines()[0].strip() if out else compiler


def plan(target: str | None = None) -> dict[str, object]:
    """What will be built, and the cache key that names it."""
    target = target or os.environ.get("RVU_LLAMA_CPU", "portable") or "portable"
    if target not in TARGETS:
        raise SystemExit(
            f"RVU_LLAMA_CPU={target!r} is not one of {', '.join(TARGETS)} "
            "(portable: runs on every CPU of its level; native: -march=native for this host)."
        )
    machine = platform.machine().lower()
    flags = host_cpu_flags()
    cmake = list(COMMON_CMAKE_ARGS)
    host_key = ""
    if target == "native":
        cmake.append("-DGGML_NATIVE=ON")
        level = f"native-{machine}"
        # the binary depends on this host's ISA: the key must too
        host_key = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]
    elif machine in ("x86_64", "amd64"):
        level = x86_64_level(flags)
        cmake.append("-DGGML_NATIVE=OFF")
        cmake += [f"-D{s}={'ON' if s in GGML_X86_ON[level] else 'OFF'}" for s in GGML_X86_SWITCHES]
    else:
        level = f"generic-{machine}"
        cmake.append("-DGGML_NATIVE=OFF")
    version = llama_cpp_python_version()
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}-{sysconfig.get_platform()}"
    compiler = compiler_version()
    key_material = json.dumps(
        {
            "version": version,
            "target": target,
            "level": level,
            "cmake": cmake,
            "compiler": compiler,
            "python": python_tag,
            "host": host_key,
        },
        sort_keys=True,
    )
    key = hashlib.sha256(key_material.encode()).hexdigest()[:16]
    return {
        "package": "llama-cpp-python",
        "version": version,
        "target": target,
        "level": level,
        "cmake_args": cmake,
        "compiler": compiler,
        "python": python_tag,
        "host_flags_key": host_key,
        "key": key,
        "dir": str(wheel_cache() / f"llama-cpp-python-{version}-{level}-{key}"),
    }


def wheel_cache() -> Path:
    base = os.environ.get("RVU_WHEEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "rvu", "wheels"
    )
    return Path(base)


def cached_wheel(info: dict[str, object]) -> Path | None:
    directory = Path(str(info["dir"]))
    if not (directory / "build-info.json").is_file():
        return None
    wheels = sorted(directory.glob("llama_cpp_python-*.whl"))
    return wheels[0] if len(wheels) == 1 else None


def build(info: dict[str, object]) -> Path:
    """Compile the wheel into a staging folder and move it into the cache whole (nothing half-written)."""
    directory = Path(str(info["dir"]))
    directory.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join(info["cmake_args"])  # type: ignore[arg-type]
    env["FORCE_CMAKE"] = "1"
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    print(
        f"build-llama-cpp: compiling llama-cpp-python {info['version']} for {info['level']} "
        f"({env['CMAKE_ARGS']}); minutes of CPU, once per target",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=directory.parent, prefix=".staging-") as staging:
        # --no-cache-dir: pip's own wheel cache is keyed by the source only and would hand back a
        # wheel built with other flags.
        command = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-binary",
            "llama-cpp-python",
            "-w",
            staging,
            f"llama-cpp-python=={info['version']}",
        ]
        # pip's output goes to stderr: stdout carries only the wheel path, which setup.sh captures
        result = subprocess.run(command, env=env, stdout=sys.stderr)
        if result.returncode != 0:
            raise SystemExit(
                f"build-llama-cpp: compiling llama-cpp-python failed (exit {result.returncode}); "
                "see the compiler output above. It needs a C/C++ toolchain and cmake >= 3.21."
            )
        wheels = list(Path(staging).glob("llama_cpp_python-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"build-llama-cpp: expected one wheel in {staging}, found {wheels}")
        built = dict(
            info,
            built_on=sorted(host_cpu_flags()),
            build_seconds=round(time.monotonic() - started, 1),
            wheel=wheels[0].name,
        )
        (Path(staging) / "build-info.json").write_text(json.dumps(built, indent=2, sort_keys=True) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
        # TemporaryDirectory's cleanup of the moved path is a no-op; recreate it so cleanup is quiet
        Path(staging).mkdir(exist_ok=True)
    wheel = cached_wheel(info)
    assert wheel is not None
    return wheel


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "wheel"
    info = plan()
    if command == "plan":
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    if command == "key":  # what names the build: setup.sh folds it into its up-to-date stamp
        print(f"{info['level']}-{info['key']}")
        return 0
    if command == "wheel":
        wheel = cached_wheel(info) or build(info)
        print(wheel)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
