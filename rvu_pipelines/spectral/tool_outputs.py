"""What the inline ``hfer`` switch reads in the agent: real AgentDojo tool outputs, clean and injected.

For every user task of a suite, AgentDojo's own ground-truth solution is executed twice with the suite's tools
(``FunctionsRuntime.run_function``, the call the agent's tool loop makes): once in the default environment (no
injection: the placeholders hold the suite's benign defaults) and once with the configured AgentDojo attack's
texts planted for one injection task (rotating through the suite's injection tasks, so the payloads vary).
Each output is rendered as the agent's tool message renders it (``tool_result_to_str``) and put in the form the
switch reads in the agent (the user's request, a blank line, the tool output: ``DOCUMENT_TEMPLATE``).

An output that the planted texts change becomes a pair (clean, label 0; injected, label 1; one group); an
output no placeholder reaches is a clean output only (label 0, a group of its own): it measures what the
switch costs on the ordinary traffic the agent reads. The split is fixed per user task (sha256, the
contamination sets' 60 / 40): a deployment may know the *clean* outputs of its calibration tasks (its own
benign traffic, for an FPR-controlled threshold), never an injected one, and never a held-out task's.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import polars as pl

from rvu_pipelines.spectral.data import DOCUMENT_TEMPLATE, example_frame, heldout_split

SOURCE_PREFIX = "agentdojo_"


def _render(runtime: object, env: object, calls: Iterable[object]) -> list[str]:
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str

    outputs = []
    for call in calls:
        result, error = runtime.run_function(env, call.function, call.args)  # type: ignore[attr-defined]
        outputs.append(error if error else tool_result_to_str(result))
    return outputs


def _example(request: str, output: str, label: int, source: str, group: str, split: str) -> dict:
    prefix = DOCUMENT_TEMPLATE.format(instruction=request)
    return {
        "text": prefix + output,
        "label": label,
        "source": source,
        "group": group,
        "doc_start": len(prefix),
        "doc_end": len(prefix) + len(output),
        "split": split,
    }


def agentdojo_tool_outputs(
    benchmark_version: str = "v1.2.2",
    suite_names: Iterable[str] | None = None,
    attack: str = "important_instructions",
) -> pl.DataFrame:
    """Clean and injected tool outputs of AgentDojo's ground-truth solutions (``EXAMPLE_COLUMNS``).

    ``source`` is ``agentdojo_<suite>``; ``group`` is ``agentdojo/<suite>/<user task>/<call index>``. Built once
    per process and arguments (executing every suite's solutions twice takes tens of seconds)."""
    return _tool_outputs(benchmark_version, None if suite_names is None else tuple(suite_names), attack)


@lru_cache(maxsize=8)
def _tool_outputs(benchmark_version: str, suite_names: tuple[str, ...] | None, attack: str) -> pl.DataFrame:
    from agentdojo.functions_runtime import FunctionsRuntime

    from rvu_pipelines.scenarios.agentdojo_tasks import agentdojo_attack, natural_task_order, suites

    available = suites(benchmark_version)
    chosen = sorted(available) if suite_names is None else list(suite_names)
    unknown = sorted(set(chosen) - set(available))
    if unknown:
        raise ValueError(f"Unknown AgentDojo suite(s) {unknown}; allowed: {', '.join(sorted(available))}.")
    rows: list[dict] = []
    for suite_name in chosen:
        suite = available[suite_name]
        runtime = FunctionsRuntime(suite.tools)
        injection_ids = sorted(suite.injection_tasks, key=natural_task_order)
        planter = agentdojo_attack(benchmark_version, suite_name, attack)
        for number, user_id in enumerate(sorted(suite.user_tasks, key=natural_task_order)):
            task = suite.get_user_task_by_id(user_id)
            injection = suite.get_injection_task_by_id(injection_ids[number % len(injection_ids)])
            planted = planter.attack(task, injection)
            clean_env = task.init_environment(suite.load_and_inject_default_environment({}))
            calls = list(task.ground_truth(clean_env.model_copy(deep=True)))
            injected_env = task.init_environment(suite.load_and_inject_default_environment(planted))
            clean = _render(runtime, clean_env, calls)
            injected = _render(runtime, injected_env, calls)
            source = f"{SOURCE_PREFIX}{suite_name}"
            split = heldout_split(f"agentdojo/{suite_name}/{user_id}")
            for index, (plain, attacked) in enumerate(zip(clean, injected, strict=True)):
                if not plain.strip():
                    continue
                group = f"agentdojo/{suite_name}/{user_id}/{index}"
                rows.append(_example(task.PROMPT, plain, 0, source, group, split))
                if attacked != plain:
                    rows.append(_example(task.PROMPT, attacked, 1, source, group, split))
    return example_frame(rows)
