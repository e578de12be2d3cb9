"""What the CPU can do, from the kernel's own report. Standard library only: scripts/build_llama_cpp.py
imports it before the project's dependencies are installed."""

from __future__ import annotations

from pathlib import Path

# x86-64 micro-architecture levels (psABI) by the /proc/cpuinfo flags they need
X86_64_V3 = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe")
X86_64_V2 = ("sse4_1", "sse4_2", "ssse3", "popcnt")


def host_cpu_flags() -> set[str]:
    """The CPU feature flags Linux reports (empty where /proc/cpuinfo is unavailable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def x86_64_level(flags: set[str]) -> str:
    """The highest of x86-64-v3 / -v2 / baseline that every flag of the level is present for."""
    if all(f in flags for f in X86_64_V3):
        return "x86-64-v3"
    if all(f in flags for f in X86_64_V2):
        return "x86-64-v2"
    return "x86-64"
