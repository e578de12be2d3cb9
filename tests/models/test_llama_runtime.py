"""llama.cpp runs on every x86-64 CPU, and a native crash is never silent.

These hold on machines without AMX too: they check what the project passes to llama.cpp, what a real
load puts in llama.cpp's log, what the installed build was compiled for, and that a real native crash
in the probe's child process comes back as a message naming the signal and the switch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rvu_pipelines.cpu_features import host_cpu_flags, x86_64_level
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.machine import usable_cores
from rvu_pipelines.models.llama_runtime import (
    EXTRA_BUFTS_ENV,
    LlamaRuntimeSettings,
    default_model_params,
    installed_build_info,
    missing_instruction_sets,
    parse_system_info,
)
from rvu_pipelines.models.native_probe import (
    FAULT_ENV,
    NativeCrashError,
    ProbeResult,
    ensure_llama_runs,
    run_probe,
)

REPO = Path(__file__).resolve().parents[2]


def test_extra_buffer_types_are_off_by_default(monkeypatch) -> None:
    monkeypatch.delenv(EXTRA_BUFTS_ENV, raising=False)
    assert LlamaRuntimeSettings.configured().extra_bufts is False
    assert default_model_params().use_extra_bufts is False  # the struct llama.cpp receives
    monkeypatch.setenv(EXTRA_BUFTS_ENV, "1")
    assert default_model_params().use_extra_bufts is True  # the documented switch turns repacking back on


def test_the_project_model_is_loaded_without_extra_buffer_types(smollm) -> None:
    """The params struct the in-process backend really handed to llama.cpp (llama-cpp-python keeps it)."""
    assert smollm._llm.model_params.use_extra_bufts is False
    assert smollm.runtime.extra_bufts is False
    # both thread pools sized from the CPU affinity (llama-cpp-python's defaults count the machine's cores)
    context = smollm._llm.context_params
    assert context.n_threads == context.n_threads_batch == usable_cores()


def test_the_override_is_scoped_to_project_loads(monkeypatch) -> None:
    """Outside a project load, llama-cpp-python's own default (True) is untouched."""
    import llama_cpp.llama_cpp as lib

    monkeypatch.delenv(EXTRA_BUFTS_ENV, raising=False)
    default_model_params()
    assert lib.llama_model_default_params().use_extra_bufts is True


@pytest.mark.parametrize("value", ["2", "maybe", "amx"])
def test_a_bad_switch_value_names_the_variable(monkeypatch, value: str) -> None:
    monkeypatch.setenv(EXTRA_BUFTS_ENV, value)
    with pytest.raises(ConfigError, match=EXTRA_BUFTS_ENV):
        LlamaRuntimeSettings.configured()


def test_system_info_is_parsed_and_compared_with_the_cpu() -> None:
    info = (
        "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | AMX_INT8 = 1 "
        "| REPACK = 1 |"
    )
    parsed = parse_system_info(info)
    assert parsed["AVX512"] == "1" and parsed["REPACK"] == "1"
    avx2_only = {"pni", "ssse3", "avx", "avx2", "f16c", "fma"}
    assert missing_instruction_sets(info, avx2_only) == ["AMX_INT8", "AVX512"]
    assert missing_instruction_sets(info, avx2_only | {"avx512f", "amx_int8"}) == []


def test_the_installed_build_is_the_one_setup_made_and_runs_here() -> None:
    """Set-up records its build; a portable one has no AMX and no AVX-512 compiled in, and nothing it
    was compiled for is missing on this CPU."""
    import llama_cpp

    info = installed_build_info()
    assert info is not None, "llama-cpp-python was not installed by scripts/setup.sh (no rvu-llama-build.json)"
    system = parse_system_info(llama_cpp.llama_print_system_info().decode())
    if info["target"] == "portable":
        assert system.get("AMX_INT8", "0") == "0" and system.get("AVX512", "0") == "0", system
        assert "-DGGML_NATIVE=OFF" in info["cmake_args"]
    assert missing_instruction_sets(llama_cpp.llama_print_system_info().decode(), host_cpu_flags()) == []


def test_build_plan_is_keyed_by_flags_not_by_host(monkeypatch, tmp_path) -> None:
    """A portable build's cache key does not depend on the build host's CPU; a native one's does."""
    script = REPO / "scripts" / "build_llama_cpp.py"

    def plan(target: str) -> dict:
        out = subprocess.run(
            [sys.executable, str(script), "plan"],
            capture_output=True,
            text=True,
            check=True,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RVU_LLAMA_CPU": target},
        )
        return json.loads(out.stdout)

    portable, native = plan("portable"), plan("native")
    assert portable["host_flags_key"] == "" and native["host_flags_key"]
    assert portable["key"] != native["key"]
    if portable["level"] == "x86-64-v3":
        assert "-DGGML_AVX2=ON" in portable["cmake_args"]
        assert "-DGGML_AMX_INT8=OFF" in portable["cmake_args"] and "-DGGML_AVX512=OFF" in portable["cmake_args"]
    bad = subprocess.run(
        [sys.executable, str(script), "plan"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RVU_LLAMA_CPU": "sapphire"},
    )
    assert bad.returncode != 0 and "RVU_LLAMA_CPU" in bad.stderr


def test_a_real_load_keeps_the_crashing_path_off(tiny_models, monkeypatch) -> None:
    """The load log of a real model load (child process, project defaults) has no AMX or repack buffer."""
    monkeypatch.delenv(EXTRA_BUFTS_ENV, raising=False)
    result = run_probe(tiny_models["llm"].path)
    assert result.ok, result.explanation()
    assert result.buffers, "llama.cpp's load log was not captured"
    assert not any("AMX" in line for line in result.buffers), result.buffers
    assert not any("REPACK" in line for line in result.buffers), result.buffers
    assert result.completion_tokens > 0 and result.text.strip()


def test_a_native_crash_in_the_child_becomes_a_clear_error(tiny_models, monkeypatch, tmp_path) -> None:
    """A real SIGSEGV in native code (the fault switch dereferences NULL after loading the model) ends
    as a NativeCrashError naming the signal, llama.cpp's CPU features and the switch, not a dead process."""
    monkeypatch.setenv("RVU_HOME", str(tmp_path))
    monkeypatch.setenv(FAULT_ENV, "segv")
    with pytest.raises(NativeCrashError) as caught:
        ensure_llama_runs(tiny_models["llm"].path)
    message = str(caught.value)
    assert caught.value.result.signal_name == "SIGSEGV"
    assert "SIGSEGV" in message and "llama.cpp reported: CPU :" in message
    assert EXTRA_BUFTS_ENV in message and "RVU_LLAMA_CPU=portable" in message
    assert not list((tmp_path / "cache" / "native_probe").glob("*.json")), "a failed probe must not be remembered"


def test_a_passing_probe_is_remembered(tiny_models, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("RVU_HOME", str(tmp_path))
    monkeypatch.delenv(FAULT_ENV, raising=False)
    first = ensure_llama_runs(tiny_models["llm"].path)
    assert first is not None and first.ok
    assert ensure_llama_runs(tiny_models["llm"].path) is None  # remembered: no second child process


def test_explanations_name_the_cause() -> None:
    amx_crash = ProbeResult(
        model_path="m.gguf",
        settings={"extra_bufts": True},
        returncode=-11,
        seconds=1.0,
        system_info="CPU : AVX2 = 1 | AVX512 = 0 | AMX_INT8 = 1 | REPACK = 1 |",
    )
    text = amx_crash.explanation()
    assert "SIGSEGV" in text and "20824" in text and f"{EXTRA_BUFTS_ENV}=0" in text
    timeout = ProbeResult(model_path="m.gguf", settings={}, returncode=-999, seconds=180.0)
    assert "time limit" in timeout.explanation()


def test_x86_64_levels_follow_the_psabi_flags() -> None:
    v3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "sse4_1", "sse4_2", "ssse3", "popcnt"}
    assert x86_64_level(v3) == "x86-64-v3"
    assert x86_64_level(v3 - {"avx2"}) == "x86-64-v2"  # an AVX2-less CPU gets the SSE4.2 build
    assert x86_64_level({"sse2"}) == "x86-64"


def test_wheel_command_prints_only_the_wheel_path(monkeypatch, tmp_path, capsys) -> None:
    """setup.sh captures `build_llama_cpp.py wheel`'s stdout as the wheel path, so a fresh compile must
    send pip's own output elsewhere (a fresh machine once got pip's log as the "path" and set-up failed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_llama_cpp", REPO / "scripts" / "build_llama_cpp.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    real_run = subprocess.run

    def fake_pip(command, env=None, stdout=None, **kwargs):  # writes where the real pip would, honouring stdout=
        if "wheel" not in command:  # the compiler --version probe of plan()
            return real_run(command, env=env, stdout=stdout, **kwargs)
        print("Building wheel for llama-cpp-python ... done", file=stdout or sys.stdout)
        staging = Path(command[command.index("-w") + 1])
        (staging / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"wheel")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setenv("RVU_WHEEL_CACHE", str(tmp_path / "wheels"))
    monkeypatch.setattr(script.subprocess, "run", fake_pip)
    assert script.main(["build_llama_cpp.py", "wheel"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].endswith(".whl") and Path(out[0]).is_file(), out
