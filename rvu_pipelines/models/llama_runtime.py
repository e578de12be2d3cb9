"""How the project runs llama.cpp: the model parameters it passes, and what the CPU and the build can do.

The crash this guards against: llama.cpp's "extra buffer types" repack weights for special
kernels at load time. On CPUs with AMX (Intel Sapphire Rapids and later) one of them is the AMX
buffer, whose matmul segfaults (llama.cpp issue 20824), killing the whole Python process. Two layers
keep it off:

* the build: ``scripts/build_llama_cpp.py`` compiles a portable x86-64-v3 library with AMX and AVX-512
  compiled out, so the AMX kernel is not in the binary at all, whatever CPU built the wheel;
* the runtime: every model the project loads (in-process and in the OpenAI-compatible server it
  starts) gets ``use_extra_bufts = False`` unless ``RVU_LLAMA_EXTRA_BUFTS=1``, so even a native
  build on an AMX host never takes that path. SmolLM2's Q4_1 weights have no repack kernel on AVX2,
  so there the switch changes nothing (README, "LLM runtime", measured side by side).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.cpu_features import host_cpu_flags
from rvu_pipelines.machine import usable_cores
from rvu_pipelines.settings import llama_extra_bufts

EXTRA_BUFTS_ENV = "RVU_LLAMA_EXTRA_BUFTS"
BUILD_TARGET_ENV = "RVU_LLAMA_CPU"
BUILD_INFO_FILE = "rvu-llama-build.json"  # written into the venv by scripts/setup.sh

# CPU features worth naming when llama.cpp misbehaves (Linux /proc/cpuinfo spelling).
REPORTED_CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_vbmi",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
# llama.cpp's system-info names -> the /proc/cpuinfo flag the instruction set needs.
SYSTEM_INFO_TO_CPU_FLAG = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX_VNNI": "avx_vnni",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512_vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}


@dataclass(frozen=True)
class LlamaRuntimeSettings:
    """The llama.cpp model parameters the project chooses (everything else is llama-cpp-python's default).

    ``extra_bufts``: let llama.cpp repack weights into extra buffer types (CPU_REPACK, and AMX where
    the library has it). Off by default because the AMX buffer crashes; ``RVU_LLAMA_EXTRA_BUFTS=1``
    turns repacking back on.
    """

    extra_bufts: bool = False

    @classmethod
    def configured(cls) -> LlamaRuntimeSettings:
        """The settings this process was configured with (``RVU_LLAMA_EXTRA_BUFTS``)."""
        return cls(extra_bufts=llama_extra_bufts())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_PARAMS_LOCK = threading.RLock()


@contextlib.contextmanager
def model_params_applied(settings: LlamaRuntimeSettings) -> Iterator[None]:
    """While active, every ``llama_model_default_params()`` llama-cpp-python asks for carries ``settings``.

    llama-cpp-python's ``Llama.__init__`` builds its ``llama_model_params`` from that function and
    loads the model before returning, with no argument for ``use_extra_bufts``; wrapping the
    function is the one place both ``Llama`` and its server pick the value up.
    """
    import llama_cpp.llama_cpp as lib

    with _PARAMS_LOCK:
        original = lib.llama_model_default_params

        def with_settings() -> Any:
            params = original()
            params.use_extra_bufts = settings.extra_bufts
            return params

        lib.llama_model_default_params = with_settings
        try:
            yield
        finally:
            lib.llama_model_default_params = original


def open_llama(cls: type, model_path: Path | str, settings: LlamaRuntimeSettings | None = None, **kwargs: Any) -> Any:
    """``cls(model_path=..., **kwargs)`` (a ``llama_cpp.Llama`` or subclass) loaded with the project's settings.

    Thread counts not given are the cores of this process's CPU affinity: llama-cpp-python's own defaults count
    the machine's cores (half of them for generation, all for prompt batches), too many in a container's cpuset."""
    settings = settings or LlamaRuntimeSettings.configured()
    kwargs["n_threads"] = kwargs.get("n_threads") or usable_cores()
    kwargs["n_threads_batch"] = kwargs.get("n_threads_batch") or kwargs["n_threads"]
    with model_params_applied(settings):
        return cls(model_path=str(model_path), **kwargs)


def default_model_params(settings: LlamaRuntimeSettings | None = None) -> Any:
    """The ``llama_model_params`` struct a project model load passes to llama.cpp (for tests and doctor)."""
    import llama_cpp.llama_cpp as lib

    with model_params_applied(settings or LlamaRuntimeSettings.configured()):
        return lib.llama_model_default_params()


def llama_build_fingerprint(settings: LlamaRuntimeSettings | None = None) -> dict[str, Any]:
    """What llama.cpp's numbers depend on besides the model: library version, native libraries, CPU
    features (kernels are picked per CPU) and the project's runtime settings."""
    import llama_cpp

    library = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in library.glob("*") if p.is_file())
    return {
        "llama_cpp": [llama_cpp.__version__, libs],
        "cpu": sorted(host_cpu_flags()),
        "settings": (settings or LlamaRuntimeSettings.configured()).as_dict(),
    }


def host_cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_cpu_summary(flags: set[str] | None = None) -> str:
    """One line: the CPU model and which of the instruction sets that matter to llama.cpp it has."""
    flags = host_cpu_flags() if flags is None else flags
    present = [f for f in REPORTED_CPU_FLAGS if f in flags]
    absent = [f for f in REPORTED_CPU_FLAGS if f not in flags]
    return (
        f"{host_cpu_model()} ({os.cpu_count()} logical cores, {platform.machine()}): "
        f"has {' '.join(present) or 'none of them'}; lacks {' '.join(absent) or 'nothing listed'}"
    )


def parse_system_info(system_info: str) -> dict[str, str]:
    """llama.cpp's ``"CPU : SSE3 = 1 | AVX2 = 1 | ... |"`` line as a name -> value dict."""
    features: dict[str, str] = {}
    for part in system_info.replace(":", "|").split("|"):
        name, sep, value = part.partition("=")
        if sep:
            features[name.strip()] = value.strip()
    return features


def missing_instruction_sets(system_info: str, flags: set[str] | None = None) -> list[str]:
    """Instruction sets the library was compiled with that this CPU lacks (each one is a SIGILL waiting)."""
    flags = host_cpu_flags() if flags is None else flags
    if not flags:
        return []
    compiled = parse_system_info(system_info)
    return sorted(
        name for name, flag in SYSTEM_INFO_TO_CPU_FLAG.items() if compiled.get(name) == "1" and flag not in flags
    )


def installed_build_info() -> dict[str, Any] | None:
    """What scripts/setup.sh recorded about the llama-cpp-python build in this environment, if anything."""
    path = Path(sys.prefix) / BUILD_INFO_FILE
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
