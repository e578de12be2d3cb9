"""AgentDojo scenarios: (suite, user task, injection task) triples from the installed ``agentdojo``
package, run by AgentDojo itself (``TaskSuite.run_task_with_pipeline``), so utility and security come
from the tasks' own checks.

Attack: ``important_instructions`` (AgentDojo's strongest baseline). It addresses the model by name and
refuses pipelines whose name holds none of ``agentdojo.models.MODEL_NAMES``; we fix that name to the
``"local"`` entry ("Local model"), which every local pipeline honestly is, so the injected text is the
same for every defense and model profile (cache keys and golden files depend on it).

AgentDojo gives every episode the suite's *whole* tool set; the schema sizes (render_tool_schema,
tokens ~ chars/4) are banking 11 tools ~440 tokens, slack 11 ~455, workspace 24 ~1350, travel 28 ~1540,
which is why the default subset (configs/benchmarks.yaml) is banking + slack.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from agentdojo.agent_pipeline.agent_pipeline import AgentPipeline
from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.errors import AbortAgentError
from agentdojo.functions_runtime import EmptyEnv, Env, FunctionsRuntime
from agentdojo.types import ChatMessage
from pydantic import BaseModel

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.agentdojo_clock import install_fixed_clock, install_ordered_participants
from rvu_pipelines.scenarios.agentdojo_yaml import install_libyaml_parser
from rvu_pipelines.scenarios.axes import AGENTDOJO_SUITE_BENCHMARKS
from rvu_pipelines.scenarios.catalog import BenchmarkSpec, register_benchmark
from rvu_pipelines.scenarios.contract import ScenarioOutcome

ATTACK = "important_instructions"
ATTACK_MODEL_KEY = "local"  # agentdojo.models.MODEL_NAMES["local"] == "Local model"


@lru_cache(maxsize=4)
def suites(benchmark_version: str) -> dict[str, Any]:
    from agentdojo.task_suite.load_suites import get_suites  # every suite's environment (seconds): on first use

    try:
        loaded = dict(get_suites(benchmark_version))
    except Exception as exc:
        raise ConfigError(
            f"configs/benchmarks.yaml agentdojo.benchmark_version: agentdojo has no benchmark "
            f"version '{benchmark_version}' ({exc}); use e.g. v1.2.2."
        ) from exc
    install_fixed_clock()  # the tools' e-mail / file stamps: one fixed moment, so episodes replay identically
    install_ordered_participants()  # a new event's participants in one order whatever the process's hash seed
    install_libyaml_parser()  # each episode's environment parse in C, to the same objects
    return loaded


@lru_cache(maxsize=16)
def agentdojo_attack(benchmark_version: str, suite_name: str, attack_name: str) -> Any:
    """AgentDojo's registered attack ``attack_name`` for one suite (a clear error naming the config field)."""
    from agentdojo.attacks.attack_registry import ATTACKS, load_attack  # with the suites: on first use

    if attack_name not in ATTACKS:
        raise ConfigError(
            f"configs/benchmarks.yaml agentdojo.attack: unknown attack '{attack_name}'; "
            f"allowed: {', '.join(sorted(ATTACKS))}."
        )
    named = AgentPipeline([])
    named.name = ATTACK_MODEL_KEY  # only read for the model's name in the injected text
    return load_attack(attack_name, suites(benchmark_version)[suite_name], named)


class _Recorder(BasePipelineElement):
    """Passes through to the pipeline and keeps its last messages (AgentDojo returns only booleans)."""

    def __init__(self, inner: BasePipelineElement) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", None)
        self.messages: list[ChatMessage] = []
        self.aborted: str | None = None

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 - AgentDojo's signature
    ) -> tuple:
        try:
            result = self.inner.query(query, runtime, env, messages, extra_args)
        except AbortAgentError as exc:
            self.messages, self.aborted = list(exc.messages), str(exc)
            raise
        self.messages, self.aborted = list(result[3]), None
        return result


@dataclass(frozen=True)
class AgentDojoScenario:
    """One (suite, user task, injection task); ``scenario_id`` = ``agentdojo/<suite>/<user>/<injection>``."""

    suite_name: str
    user_task_id: str
    injection_task_id: str
    benchmark_version: str = "v1.2.2"
    attack_name: str = ATTACK
    # replaces the text of every injection placeholder (None: the attack's own texts)
    injection_override: str | None = None

    @property
    def scenario_id(self) -> str:
        return f"agentdojo/{self.suite_name}/{self.user_task_id}/{self.injection_task_id}"

    @property
    def benchmark(self) -> str:
        return "agentdojo"

    @property
    def suite(self) -> Any:
        return suites(self.benchmark_version)[self.suite_name]

    @property
    def user_task_obj(self) -> Any:
        return self.suite.get_user_task_by_id(self.user_task_id)

    @property
    def injection_task_obj(self) -> Any:
        return self.suite.get_injection_task_by_id(self.injection_task_id)

    @property
    def user_task(self) -> str:
        return self.user_task_obj.PROMPT

    @property
    def injections(self) -> dict[str, str]:
        """Injection placeholder -> attack text, as the configured AgentDojo attack builds them."""
        attack = agentdojo_attack(self.benchmark_version, self.suite_name, self.attack_name)
        built = dict(sorted(attack.attack(self.user_task_obj, self.injection_task_obj).items()))
        if self.injection_override is None:
            return built
        return {placeholder: self.injection_override for placeholder in built}

    @property
    def injection(self) -> str:
        if self.injection_override is not None:
            return self.injection_override
        return next(iter(self.injections.values()), "")

    def with_injection(self, text: str) -> AgentDojoScenario:
        """This triple with ``text`` in every placeholder the attack fills (the placeholders the user task's
        tools read). The injection task, and so AgentDojo's security check, stays the same."""
        return replace(self, injection_override=text)

    def environment(self) -> Env | None:
        """The suite's environment with :attr:`injections` planted, or None to let AgentDojo plant them.

        AgentDojo formats injections into the suite's YAML source before parsing it, so inside its
        double-quoted scalars a newline folds into a space and a double quote or backslash breaks the file.
        Its own attack texts load that way (their newlines fold, and that is the benchmark's text); an override
        (a forged chat turn, an optimised string) may hold all three and must reach the tools as written.
        So an override is planted as AgentDojo's own ``check`` plants canaries: a plain marker goes through
        the YAML, and the parsed environment has the marker replaced by the text, which the tools then
        return exactly as given.
        """
        if self.injection_override is None:
            return None
        text = self.injection_override
        marker = f"RVUPLANTED{hashlib.sha256(text.encode('utf-8')).hexdigest()[:24]}"
        loaded = self.suite.load_and_inject_default_environment(dict.fromkeys(self.injections, marker))
        planted = _replace_text(loaded, marker, text)
        if marker in planted.model_dump_json():
            raise RuntimeError(f"{self.scenario_id}: the injection marker survived in a field it could not reach.")
        return planted

    @property
    def task_tools(self) -> frozenset[str]:
        """The answer key: the tools of AgentDojo's ground-truth solution of the user task.

        No deployed gate can know it. Only the ``rvg_oracle`` defense (upper bound: reads the answer key)
        reads it; the realistic ``rvg`` gate (and the RVU defenses) plan the allowed tools before the
        episode from :attr:`user_task` and the suite's tool declarations (configs/rvg_policies.yaml).
        """
        return _ground_truth_tools(self.benchmark_version, self.suite_name, self.user_task_id)

    @property
    def injection_calls(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """The injection task's ground-truth calls (function, arguments) on the default environment: what the
        attacker's goal needs the agent to call. Read-only (shared by every scenario of the same goal)."""
        return _injection_ground_truth(self.benchmark_version, self.suite_name, self.injection_task_id)

    @property
    def injection_goal(self) -> str:
        """The injection task's goal in AgentDojo's words (its ``GOAL``): the attacker's aim where the task has no
        ground-truth call (v1.2's travel ``injection_task_6`` and workspace 6-13, whose security checks read the
        answer or the environment)."""
        return str(self.suite.get_injection_task_by_id(self.injection_task_id).GOAL)

    @property
    def tool_declarations(self) -> tuple[str, ...]:
        """The names of the tools the suite declares (what the agent is given), sorted."""
        return tuple(sorted(tool.name for tool in self.suite.tools))

    def run(self, pipeline: BasePipelineElement) -> ScenarioOutcome:
        recorder = _Recorder(pipeline)
        utility, security = self.suite.run_task_with_pipeline(
            recorder, self.user_task_obj, self.injection_task_obj, self.injections, environment=self.environment()
        )
        details = {
            "suite": self.suite_name,
            "user_task": self.user_task_id,
            "injection_task": self.injection_task_id,
            "attack": self.attack_name,
            "aborted": recorder.aborted,
        }
        return ScenarioOutcome(
            bool(security), float(utility), recorder.messages, f"agentdojo:{self.attack_name}(task checks)", details
        )


def _replace_text(value: Any, old: str, new: str) -> Any:
    """``value`` with ``old`` replaced by ``new`` in every string it holds (pydantic models, containers and
    dictionary keys included); models are copied, never changed in place."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        return value.model_copy(update={name: _replace_text(getattr(value, name), old, new) for name in fields})
    if isinstance(value, dict):
        return {_replace_text(key, old, new): _replace_text(item, old, new) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(_replace_text(item, old, new) for item in value)
    return value


@lru_cache(maxsize=512)
def _ground_truth_tools(benchmark_version: str, suite_name: str, user_task_id: str) -> frozenset[str]:
    """The tools of the user task's ground-truth solution: the answer key (``rvg_oracle`` only)."""
    suite = suites(benchmark_version)[suite_name]
    task = suite.get_user_task_by_id(user_task_id)
    env = task.init_environment(suite.load_and_inject_default_environment({}))
    return frozenset(call.function for call in task.ground_truth(env))


@lru_cache(maxsize=512)
def _injection_ground_truth(
    benchmark_version: str, suite_name: str, injection_task_id: str
) -> tuple[tuple[str, dict[str, Any]], ...]:
    suite = suites(benchmark_version)[suite_name]
    env = suite.load_and_inject_default_environment({})
    calls = suite.get_injection_task_by_id(injection_task_id).ground_truth(env)
    return tuple((call.function, dict(call.args)) for call in calls)


def agentdojo_scenarios(
    benchmark_version: str, attack: str, selection: dict[str, tuple[list[str] | None, list[str] | None]]
) -> list[AgentDojoScenario]:
    """Every triple of the selection ``{suite: (user task ids or None=all, injection ids or None=all)}``,
    sorted by suite then AgentDojo's natural task order."""
    available = suites(benchmark_version)
    out: list[AgentDojoScenario] = []
    for suite_name in sorted(selection):
        if suite_name not in available:
            raise ConfigError(
                f"configs/benchmarks.yaml agentdojo.suites: unknown suite '{suite_name}'; "
                f"allowed: {', '.join(sorted(available))}."
            )
        suite = available[suite_name]
        users, injections = selection[suite_name]
        user_ids = _pick(users, list(suite.user_tasks), f"agentdojo.suites.{suite_name}.user_tasks")
        inj_ids = _pick(injections, list(suite.injection_tasks), f"agentdojo.suites.{suite_name}.injection_tasks")
        out.extend(AgentDojoScenario(suite_name, u, i, benchmark_version, attack) for u in user_ids for i in inj_ids)
    return out


def natural_task_order(task_id: str) -> tuple[str, int]:
    """Sort key putting ``user_task_2`` before ``user_task_10``."""
    head, _, num = task_id.rpartition("_")
    return (head, int(num)) if num.isdigit() else (task_id, -1)


def _pick(wanted: list[str] | None, available: list[str], where: str) -> list[str]:
    if wanted is None:
        return sorted(available, key=natural_task_order)
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise ConfigError(
            f"configs/benchmarks.yaml {where}: unknown task id(s) {unknown}; "
            f"allowed: {', '.join(sorted(available, key=natural_task_order))} (or 'all')."
        )
    return sorted(set(wanted), key=natural_task_order)


def _benchmarks_config(config: Any) -> Any:
    from rvu_pipelines.scenarios.registry import load_benchmarks_config

    return config or load_benchmarks_config()


def _all_agentdojo(config: Any) -> list[AgentDojoScenario]:
    """The configured subset of suites and tasks (configs/benchmarks.yaml)."""
    config = _benchmarks_config(config)
    return agentdojo_scenarios(config.agentdojo_version, config.agentdojo_attack, config.agentdojo_suites)


def _find_agentdojo(scenario_id: str, config: Any) -> AgentDojoScenario | None:
    """One triple by id, without listing the configured subset (any installed suite and task)."""
    parts = scenario_id.split("/")
    if len(parts) != 4:
        return None
    config = _benchmarks_config(config)
    return agentdojo_scenarios(config.agentdojo_version, config.agentdojo_attack, {parts[1]: ([parts[2]], [parts[3]])})[
        0
    ]


def _whole_suite(suite_name: str) -> Callable[[Any], list[AgentDojoScenario]]:
    """Every user task × injection task of one suite, at the configured version and attack."""

    def scenarios(config: Any) -> list[AgentDojoScenario]:
        config = _benchmarks_config(config)
        return agentdojo_scenarios(config.agentdojo_version, config.agentdojo_attack, {suite_name: (None, None)})

    return scenarios


register_benchmark(
    BenchmarkSpec(
        "agentdojo", "agentdojo/", "agentdojo/<suite>/<user_task>/<injection_task>", _all_agentdojo, _find_agentdojo
    )
)
for _name, _suite in AGENTDOJO_SUITE_BENCHMARKS.items():
    register_benchmark(
        BenchmarkSpec(
            _name,
            f"agentdojo/{_suite}/",
            f"agentdojo/{_suite}/<user_task>/<injection_task>",
            _whole_suite(_suite),
            _find_agentdojo,
        )
    )
