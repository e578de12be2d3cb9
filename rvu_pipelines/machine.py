"""The machine a measurement ran on, as results record it: CPU model and count, architecture, Python."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rvu_pipelines.atomic_write import write_atomically


def machine() -> dict[str, str | int | None]:
    """The CPU the numbers belong to: timings and ratios move with the core count and the model."""
    model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "arch": platform.machine(), "python": platform.python_version()}


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's cpuset, a pinned test worker), which
    is what a thread pool should be sized to; ``os.cpu_count()`` counts the whole machine."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this platform
        return max(1, os.cpu_count() or 1)


def machine_line() -> str:
    """One line for a results stamp, e.g. ``AMD EPYC, 2 cores (x86_64)``."""
    found = machine()
    return f"{found['cpu'] or 'unknown CPU'}, {found['cpus']} cores ({found['arch']})"


def results_stamp(command: str) -> dict[str, str]:
    """What a generated result carries: the command, the commit, the date (UTC) and the machine."""
    from datetime import UTC, datetime

    from rvu_pipelines.tracking import git_commit

    return {
        "command": command,
        "commit": git_commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine_line(),
    }


def stamp_line(stamp: dict[str, str]) -> str:
    """``Measured <date> on <machine> at commit <commit>: `<command>`.``"""
    return f"Measured {stamp['date']} on {stamp['machine']} at commit {stamp['commit'][:12]}: `{stamp['command']}`."


def write_stamp(folder: Path, command: str | None = None) -> Path:
    """``folder/stamp.json``: the ``results_stamp`` of the outputs a study just wrote there (``rvu report`` reads
    it). ``command`` defaults to this process's command line."""
    import json
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    line = command if command is not None else " ".join(["python", *sys.argv])
    return write_atomically(folder / "stamp.json", json.dumps(results_stamp(line), indent=1, sort_keys=True) + "\n")


@contextmanager
def thread_limit(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads and the BLAS pools at ``threads`` inside the block (None: unchanged)."""
    if threads is None:
        yield
        return
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        torch.set_num_threads(before)
