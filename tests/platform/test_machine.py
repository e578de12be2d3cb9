"""Thread pools are sized to the cores this process may use, not to the whole machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rvu_pipelines.machine import machine, usable_cores


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_usable_cores_follows_the_affinity_a_container_or_a_pinned_worker_sets() -> None:
    first = sorted(os.sched_getaffinity(0))[0]
    code = (
        f"import os; os.sched_setaffinity(0, {{{first}}}); "
        "from rvu_pipelines.machine import usable_cores; print(usable_cores())"
    )
    pinned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"
    assert usable_cores() == len(os.sched_getaffinity(0))
    assert machine()["cpus"] == os.cpu_count()  # results still name the machine's cores
