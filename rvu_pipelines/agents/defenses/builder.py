"""The eight defenses of the attack table, each an AgentDojo pipeline over the same LLM element.

``build_pipeline(defense, llm, scenario, settings)`` returns a :class:`DefensePipeline` (an
``AgentPipeline`` that also carries an :class:`EpisodeTrace` of what the defense did: blocked calls,
filtered tool outputs, rejected tags), so the episode runner can count and record it as provenance.

- ``vanilla``: system message, user query, LLM, tool loop: the undefended agent.
- ``classifier``: tool outputs scored by an injection detector before the LLM reads them; flagged ones
  are replaced by a notice (AgentDojo's ``PromptInjectionDetector`` with any ``InjectionDetector``).
- ``hfer``: seed 004's spectral kill switch on the agent's own weights (``hfer.py``): each tool output is
  read by the switch before the LLM; when it fires the episode stops before generation (AgentDojo's
  ``AbortAgentError``), recorded as the row's ``aborted`` and a ``defense_abort`` provenance record.
  ``DefenseSettings.hfer_detector`` is by default the default profile's switch (``spectral.agent_switch``:
  sink-free graph, layer and statistic from 20 labelled examples, threshold at 5 % FPR on clean tool
  outputs); it loads nothing until an hfer episode scores a tool output.
- ``fath``: FATH (Wang et al. 2024, arXiv 2410.21492) as published: a secret per episode, a hash-based
  tag per message (the user's instruction carries the authorised one, each tool output its own), the
  model told to reply inside the authorised tag, and a parser after every LLM call that keeps only the
  authorised section: a reply without one is rejected (refusal text), and only tool calls written inside
  it are executed (see ``fath.py``).
- ``rvg``: a verifier-gated tool boundary: each call is checked against ``configs/tool_allowlist.yaml``
  and the tools the request may use before it runs; blocked calls never execute and the model is told.
  For AgentDojo those tools are planned before the episode from the user's request and the suite's tool
  declarations (``configs/rvg_policies.yaml``, ``rvg_policy.py``); InjecAgent and BIPIA declare the one
  tool of their protocol's pre-filled call.
- ``rvg_oracle``: upper bound: reads the answer key. The same gate with AgentDojo's ground-truth
  solution tools (``scenario.task_tools``), which no deployed gate can know; reported next to ``rvg``.
- ``rvu_v1`` / ``rvu_v2``: the (realistic) RVG pipeline; after the episode its provenance goes through recovery
  (v1 parent/child closure + binary purge, or the v2 adapter-aware core) and a signed certificate
  (done by ``rvu_pipelines.agents.episode``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.basic_elements import InitQuery, SystemMessage
from agentdojo.agent_pipeline.tool_execution import ToolsExecutionLoop, ToolsExecutor
from agentdojo.functions_runtime import EmptyEnv, Env, FunctionCall, FunctionsRuntime
from agentdojo.types import ChatAssistantMessage, ChatMessage

from rvu_pipelines.agents.defenses.allowlist import ToolAllowlist, load_tool_allowlist
from rvu_pipelines.agents.defenses.elements import (
    DefensePipeline,
    DetectorFilter,
    EpisodeTrace,
    FathInitQuery,
    FathResponse,
    FathSession,
    FathUntrustedTools,
    FathVerify,
    Planner,
    ToolGate,
)
from rvu_pipelines.agents.defenses.fath import FATH_POLICY, episode_secret, load_or_create_fath_key
from rvu_pipelines.agents.defenses.hfer import DEFAULT_THRESHOLD as HFER_THRESHOLD
from rvu_pipelines.agents.defenses.registry import Built, EpisodeStart, builder_for, defense_builder
from rvu_pipelines.agents.defenses.rvg_policy import RvgPolicies, load_rvg_policies
from rvu_pipelines.agents.llm_element import DEFAULT_SYSTEM_PROMPT, ChatModelLLM
from rvu_pipelines.attacks.catalog import GateCheck
from rvu_pipelines.detectors.heuristic import HeuristicDetector
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.models.llm import ChatModel
from rvu_pipelines.scenarios.axes import DEFENSES, GATED_DEFENSES
from rvu_pipelines.scenarios.contract import Scenario, prefill_calls
from rvu_pipelines.spectral.agent_switch import LazyHferDetector

PLANNED_BENCHMARKS = frozenset({"agentdojo"})  # benchmarks whose allowed tools the realistic gate plans


# ---------------------------------------------------------------------------------------- settings


def _default_detector() -> Any:
    return HeuristicDetector()


def _default_hfer_detector() -> Any:
    """The default profile's switch; resolving, calibrating and loading wait for the first hfer score."""
    return LazyHferDetector.for_profile(None)


@dataclass(frozen=True)
class DefenseSettings:
    """Everything the defenses need besides the LLM and the scenario.

    ``max_iters`` bounds the tool rounds (AgentDojo's ``ToolsExecutionLoop``), so an episode makes at
    most ``max_iters + 1`` LLM calls. ``fath_key`` defaults to ``state_dir()/keys/fath.key``; FATH's
    episode secret is derived from it and the scenario id (reproducible, cacheable), or from fresh random
    bytes per episode with ``fath_random_tags`` (as a deployment would run it).
    ``rvg_policies``: the realistic gate's per-suite plans (``configs/rvg_policies.yaml``).
    ``signing_key_dir`` holds the certificate key (default: the recovery folder's keys).
    ``hfer_detector``: the ``hfer`` kill switch (default: the default profile's, lazy; ``Harness.open`` passes
    its profile's, checked against the agent's weights); it fires at ``hfer_threshold`` (0.5 = the
    calibrated switch's own threshold).
    """

    detector: Any = field(default_factory=_default_detector)
    threshold: float = 0.5
    hfer_detector: Any = field(default_factory=_default_hfer_detector)
    hfer_threshold: float = HFER_THRESHOLD
    allowlist: ToolAllowlist = field(default_factory=load_tool_allowlist)
    rvg_policies: RvgPolicies = field(default_factory=load_rvg_policies)
    fath_key: bytes | None = field(default=None, repr=False)
    fath_random_tags: bool = False
    max_iters: int = 4
    max_tokens: int = 128
    seed: int = 0
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    signing_key_dir: Path | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.threshold) <= 1.0:
            raise ConfigError(f"DefenseSettings.threshold={self.threshold} is invalid; allowed values: 0.0 to 1.0.")
        if not 0.0 <= float(self.hfer_threshold) <= 1.0:
            raise ConfigError(
                f"DefenseSettings.hfer_threshold={self.hfer_threshold} is invalid; allowed values: 0.0 to 1.0."
            )
        if int(self.max_iters) < 1:
            raise ConfigError(f"DefenseSettings.max_iters={self.max_iters} is invalid; use 1 or more tool rounds.")
        if int(self.max_tokens) < 1:
            raise ConfigError(f"DefenseSettings.max_tokens={self.max_tokens} is invalid; use 1 or more.")
        if self.fath_key is not None and len(self.fath_key) < 16:
            raise ConfigError(
                "DefenseSettings.fath_key is shorter than 16 bytes; use 32 random bytes "
                "(or leave it unset to use state_dir()/keys/fath.key)."
            )
        if not hasattr(self.detector, "score"):
            raise ConfigError(
                f"DefenseSettings.detector {self.detector!r} has no score(texts) method; pass an "
                "InjectionDetector (HeuristicDetector, load_pretrained_detector('nanoguard'), ...)."
            )
        if not hasattr(self.hfer_detector, "score"):
            raise ConfigError(
                f"DefenseSettings.hfer_detector {self.hfer_detector!r} has no score(texts) method; pass "
                "LazyHferDetector.for_profile(...) or an HferDetector (any InjectionDetector works)."
            )

    def resolved_fath_key(self) -> bytes:
        return self.fath_key if self.fath_key is not None else load_or_create_fath_key()


# ----------------------------------------------------------------------------------------- builder


class PrefilledToolCalls(BasePipelineElement):
    """Appends an assistant turn holding the scenario's pre-filled tool calls (see ``prefill_calls``)."""

    name = "prefilled_tool_calls"

    def __init__(self, calls: Sequence[FunctionCall]) -> None:
        self.calls = list(calls)

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 - AgentDojo's signature
    ) -> tuple:
        turn = ChatAssistantMessage(role="assistant", content=None, tool_calls=list(self.calls))
        return query, runtime, env, [*messages, turn], extra_args


def request_planner(scenario: Scenario, policies: RvgPolicies) -> Planner:
    """The realistic gate's planner for an AgentDojo scenario: its suite's policy applied to the request
    and the declared tools the gate is handed at the first tool call. Reads only the suite's name from
    the scenario (never its solution); a suite without a policy is a ConfigError here, at build time."""
    suite_name = str(getattr(scenario, "suite_name", ""))
    suite = policies.suite(suite_name)

    def plan(request: str, declared: frozenset[str]) -> dict[str, str]:
        return suite.plan(request, declared, where=f"configs/rvg_policies.yaml agentdojo.{suite_name}").reasons

    return plan


def gate_task_tools(defense: str, scenario: Scenario, policies: RvgPolicies) -> frozenset[str]:
    """The task tools the gate of ``defense`` holds for ``scenario`` once it has planned: what its ``ToolGate`` is
    built with (the answer key for ``rvg_oracle``, the protocol's tool on InjecAgent and BIPIA), or the plan
    the realistic gate makes from the request and the suite's declarations at the first tool call."""
    if defense == "rvg_oracle" or scenario.benchmark not in PLANNED_BENCHMARKS:
        return frozenset(scenario.task_tools)
    declared = frozenset(getattr(scenario, "tool_declarations", ()))
    return frozenset(request_planner(scenario, policies)(scenario.user_task, declared))


def gate_allows(
    defense: str, scenario: Scenario, tools: Iterable[str], allowlist: ToolAllowlist, policies: RvgPolicies
) -> bool:
    """Whether the gate of ``defense`` lets every one of ``tools`` through in ``scenario`` (its allowlist policy
    over :func:`gate_task_tools`): what an attacker who knows the gate checks before choosing a goal."""
    policy = allowlist.policy_for(scenario.benchmark)
    task = gate_task_tools(defense, scenario, policies)
    return all(policy.decide(tool, task)[0] for tool in tools)


def gate_check(allowlist: ToolAllowlist, policies: RvgPolicies) -> GateCheck:
    """:func:`gate_allows` under this allowlist and planning policy, as ``(defense, scenario, tools)``."""

    def check(defense: str, scenario: Scenario, tools: frozenset[str]) -> bool:
        return gate_allows(defense, scenario, tools, allowlist, policies)

    return check


def build_pipeline(defense: str, llm: ChatModel, scenario: Scenario, settings: DefenseSettings) -> DefensePipeline:
    """The pipeline of one defense for one scenario (fresh elements and trace per episode), assembled by the
    builder its module registered (:mod:`rvu_pipelines.agents.defenses.registry`)."""
    build = builder_for(defense, DEFENSES)
    trace = EpisodeTrace()
    element = ChatModelLLM(
        llm, max_tokens=settings.max_tokens, seed=settings.seed, default_system=settings.system_prompt
    )
    # The first agent turn: the LLM, or the benchmark protocol's pre-filled tool call, which the loop
    # below then executes through this defense's own tool boundary like any other call.
    prefill = prefill_calls(scenario)
    first: BasePipelineElement = PrefilledToolCalls(prefill) if prefill else element
    built = build(defense, EpisodeStart(element, first, bool(prefill), trace), scenario, settings)
    return built if isinstance(built, DefensePipeline) else DefensePipeline(built, defense, trace)


@defense_builder("vanilla")
def _vanilla(defense: str, start: EpisodeStart, scenario: Scenario, settings: DefenseSettings) -> Built:
    return [
        SystemMessage(settings.system_prompt),
        InitQuery(),
        start.first,
        ToolsExecutionLoop([ToolsExecutor(), start.llm], max_iters=settings.max_iters),
    ]


@defense_builder("classifier")
def _classifier(defense: str, start: EpisodeStart, scenario: Scenario, settings: DefenseSettings) -> Built:
    return [
        SystemMessage(settings.system_prompt),
        InitQuery(),
        start.first,
        ToolsExecutionLoop(
            [ToolsExecutor(), DetectorFilter(settings.detector, settings.threshold, start.trace), start.llm],
            max_iters=settings.max_iters,
        ),
    ]


@defense_builder("fath")
def _fath(defense: str, start: EpisodeStart, scenario: Scenario, settings: DefenseSettings) -> Built:
    nonce = None if settings.fath_random_tags else scenario.scenario_id.encode()
    session = FathSession(episode_secret(settings.resolved_fath_key(), nonce))
    verify, parse = FathVerify(session, start.trace), FathResponse(session, start.trace)
    # the pre-filled call is the benchmark protocol's own (made for the user), not the model's: it runs;
    # every reply of the model goes through the parser
    opening: list[BasePipelineElement] = [start.first] if start.prefilled else [verify, start.first, parse]
    return [
        SystemMessage(f"{settings.system_prompt}\n\n{FATH_POLICY}"),
        FathInitQuery(session),
        *opening,
        ToolsExecutionLoop(
            [ToolsExecutor(), FathUntrustedTools(session, start.trace), verify, start.llm, parse],
            max_iters=settings.max_iters,
        ),
    ]


@defense_builder(*sorted(GATED_DEFENSES))
def _gated(defense: str, start: EpisodeStart, scenario: Scenario, settings: DefenseSettings) -> Built:
    """rvg, rvg_oracle, rvu_v1, rvu_v2: the same gated agent; the RVU ones recover after the episode."""
    policy = settings.allowlist.policy_for(scenario.benchmark)
    if defense == "rvg_oracle":  # upper bound: reads the answer key
        gate = ToolGate(policy, scenario.task_tools, start.trace)
    elif scenario.benchmark in PLANNED_BENCHMARKS:
        gate = ToolGate(policy, None, start.trace, planner=request_planner(scenario, settings.rvg_policies))
    else:  # InjecAgent, BIPIA: the protocol declares the tool of its pre-filled call
        gate = ToolGate(policy, scenario.task_tools, start.trace)
    return [
        SystemMessage(settings.system_prompt),
        InitQuery(),
        start.first,
        ToolsExecutionLoop([gate, start.llm], max_iters=settings.max_iters),
    ]
