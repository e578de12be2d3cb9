"""The executor every job runs its steps with, picked once when the code location loads.

In-process by default: the steps share one interpreter, so torch / transformers / llama.cpp load once, which on
2 cores beats any parallelism. The scale profile (``RVU_EXECUTOR=multiprocess``) runs independent steps in
separate processes, at most ``RVU_MAX_CONCURRENT`` at once; step outputs then go through the filesystem IO manager
under DAGSTER_HOME's storage, which every step process can read.
"""

from dagster import ExecutorDefinition, in_process_executor, multiprocess_executor

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.settings import env_value


def job_executor() -> ExecutorDefinition:
    kind = env_value("RVU_EXECUTOR") or "in_process"
    if kind == "in_process":
        return in_process_executor
    raw = env_value("RVU_MAX_CONCURRENT") or "2"
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"RVU_MAX_CONCURRENT={raw!r}: give a whole number of steps, at least 1.")
    return multiprocess_executor.configured({"max_concurrent": int(raw)}, name="rvu_multiprocess")


JOB_EXECUTOR = job_executor()
