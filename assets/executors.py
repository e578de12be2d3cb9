"""The executor every job runs its steps with, picked once when the code location loads.

In-process by default: the steps share one interpreter, so torch / transformers / llama.cpp load once, which on
a small CPU machine beats any parallelism. The scale profile (``RVU_EXECUTOR=multiprocess``) runs independent steps in
separate processes, at most ``RVU_MAX_CONCURRENT`` at once; ``RVU_EXECUTOR=celery`` hands them to celery workers
(on this machine or others) through the broker in ``RVU_CELERY_BROKER``. Step outputs then go through the
filesystem IO manager under DAGSTER_HOME's storage, which every step process and worker must be able to read.
"""

from dagster import ExecutorDefinition, in_process_executor, multiprocess_executor

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.settings import env_value


def job_executor() -> ExecutorDefinition:
    kind = env_value("RVU_EXECUTOR") or "in_process"
    if kind == "in_process":
        return in_process_executor
    if kind == "celery":  # steps become celery tasks; `rvu scale up` starts the broker and the workers
        from dagster_celery import celery_executor

        broker = env_value("RVU_CELERY_BROKER") or "redis://127.0.0.1:6380/0"
        return celery_executor.configured({"broker": broker, "backend": broker}, name="rvu_celery")
    raw = env_value("RVU_MAX_CONCURRENT") or "2"
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"RVU_MAX_CONCURRENT={raw!r}: give a whole number of steps, at least 1.")
    # each step forks from a server that imported the code location once, instead of a fresh interpreter
    # importing Dagster and the definitions again per step (the code location imports neither torch nor llama.cpp,
    # so nothing with threads or native state is forked)
    config = {"max_concurrent": int(raw), "start_method": {"forkserver": {}}}
    return multiprocess_executor.configured(config, name="rvu_multiprocess")


JOB_EXECUTOR = job_executor()
