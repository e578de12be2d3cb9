"""The defenses' AgentDojo pipeline elements and the per-episode trace they fill in.

``DetectorFilter`` (classifier), ``FathInitQuery`` / ``FathVerify`` / ``FathUntrustedTools`` /
``FathResponse`` (FATH, sharing one ``FathSession``) and ``ToolGate`` (RVG and the RVU defenses); each
records what it did in an
:class:`EpisodeTrace`, which the episode runner reads for the counts and the provenance log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentdojo.agent_pipeline.agent_pipeline import AgentPipeline
from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.pi_detector import PromptInjectionDetector
from agentdojo.agent_pipeline.tool_execution import ToolsExecutor
from agentdojo.functions_runtime import EmptyEnv, Env, FunctionCall, FunctionsRuntime
from agentdojo.types import (
    ChatAssistantMessage,
    ChatMessage,
    ChatUserMessage,
    get_text_content_as_str,
    text_content_block_from_string,
)

from rvu_pipelines.agents.defenses.allowlist import ToolPolicy
from rvu_pipelines.agents.defenses.fath import (
    FATH_REFUSAL,
    authorised_section,
    message_tag,
    verify_instruction,
    wrap_data,
    wrap_instruction,
)
from rvu_pipelines.agents.llm_element import parse_tool_calls

FILTERED_NOTICE = "<Data omitted because a prompt injection was detected>"


# ------------------------------------------------------------------------------------------- trace


@dataclass(frozen=True)
class BlockedCall:
    """A call the tool boundary refused: the assistant message it came from, the call, why."""

    message_index: int
    function: str
    args: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class DefenseAbort:
    """A defense stopped the episode before the LLM read a tool output (the ``hfer`` kill switch): which
    output (its tool message), what fired (layer, statistic, score against threshold, detector version) and
    the ``AbortAgentError`` message, which AgentDojo appends as the episode's closing assistant message."""

    defense: str
    message_index: int
    score: float
    threshold: float
    detector: str
    layer: int | None
    statistic: str | None
    reason: str

    def as_record(self) -> dict[str, Any]:
        return {
            "defense": self.defense,
            "tool_message_index": self.message_index,
            "score": self.score,
            "threshold": self.threshold,
            "detector": self.detector,
            "layer": self.layer,
            "statistic": self.statistic,
            "reason": self.reason,
            "stopped_before_generation": True,
        }


@dataclass
class EpisodeTrace:
    """What the defense elements did during one episode (read by the provenance log and the counts)."""

    blocked: list[BlockedCall] = field(default_factory=list)
    # tool message index -> text before a defense changed it
    original_outputs: dict[int, str] = field(default_factory=dict)
    filtered: dict[int, float] = field(default_factory=dict)  # tool message index -> detector score (replaced)
    rejected_instructions: int = 0  # user messages whose FATH tag did not verify
    rejected_replies: int = 0  # FATH: replies with no section authenticated for the user's instruction
    response_authenticated: bool | None = None  # FATH: the last reply carried the authorised tag
    # RVG: the tools the request may use, fixed before the first tool call (tool -> why), or None
    planned_tools: dict[str, str] | None = None
    scored: dict[int, float] = field(default_factory=dict)  # hfer: tool message index -> switch score (all read)
    abort: DefenseAbort | None = None  # hfer: the switch fired and the episode stopped before generation


class DefensePipeline(AgentPipeline):
    """An ``AgentPipeline`` that knows its defense name and carries the episode's trace."""

    def __init__(self, elements: Sequence[BasePipelineElement], defense: str, trace: EpisodeTrace) -> None:
        super().__init__(list(elements))
        self.defense = defense
        self.trace = trace
        self.name = defense


def _trailing_tool_indices(messages: Sequence[ChatMessage]) -> list[int]:
    indices = []
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] != "tool":
            break
        indices.append(index)
    return sorted(indices)


def _text(message: ChatMessage) -> str:
    content = message.get("content")
    return get_text_content_as_str(content) if content else ""


# ---------------------------------------------------------------------------------------- elements


class DetectorFilter(PromptInjectionDetector):
    """AgentDojo's PromptInjectionDetector driven by any ``InjectionDetector`` at a threshold.

    Scores the new tool outputs in one batch; a flagged output's text is replaced by a notice (the
    original is kept in the trace for the provenance log). Messages are copied, never mutated. A
    detector that fails on an output (a ``DetectorError`` or any other exception) flags it, score 1.0,
    and the episode goes on: the batch is retried one output at a time, so only the outputs the detector
    cannot score are replaced; each failure is logged and counted in ``errors``.
    """

    def __init__(self, detector: Any, threshold: float, trace: EpisodeTrace) -> None:
        super().__init__(mode="message", raise_on_injection=False)
        self.detector = detector
        self.threshold = float(threshold)
        self.trace = trace
        self.errors = 0

    def detect(self, tool_output: str) -> tuple[bool, float]:
        score = self._scores([tool_output])[0]
        return score >= self.threshold, score

    def _scores(self, texts: list[str]) -> list[float]:
        try:
            scores = [float(s) for s in self.detector.score(texts)]
            if len(scores) != len(texts) or any(score != score for score in scores):  # a count mismatch, or NaN
                raise ValueError(f"{len(scores)} scores (NaN or a wrong count) for {len(texts)} tool outputs")
            return scores
        except Exception as exc:  # a detector failure flags the output; it never stops the episode
            if len(texts) > 1:
                return [self._scores([text])[0] for text in texts]
            self.errors += 1
            name = getattr(self.detector, "name", type(self.detector).__name__)
            logging.getLogger(__name__).warning(
                "classifier defense: %s failed on a tool output (%s: %s); the output is flagged",
                name,
                type(exc).__name__,
                str(exc)[:200],
            )
            return [1.0]

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        indices = [i for i in _trailing_tool_indices(messages) if _text(messages[i]).strip()]
        if not indices:
            return query, runtime, env, messages, extra_args
        scores = self._scores([_text(messages[i]) for i in indices])
        updated = list(messages)
        for index, score in zip(indices, scores, strict=True):
            if score >= self.threshold:
                self.trace.original_outputs.setdefault(index, _text(messages[index]))
                self.trace.filtered[index] = score
                updated[index] = {**messages[index], "content": self.transform(list(messages[index]["content"]))}  # type: ignore[typeddict-item]
        return query, runtime, env, updated, extra_args


@dataclass
class FathSession:
    """One episode's FATH state, shared by its elements: the episode secret and the authorised tag."""

    secret: bytes = field(repr=False)
    authorised_tag: str | None = None
    wrapped_tools: set[int] = field(default_factory=set)


class FathInitQuery(BasePipelineElement):
    """InitQuery for FATH: the user's query enters inside its authorised tag (see ``wrap_instruction``)."""

    def __init__(self, session: FathSession) -> None:
        self.session = session

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        index = len(messages)
        self.session.authorised_tag = message_tag(self.session.secret, "user", index, query)
        wrapped = wrap_instruction(self.session.secret, query, index)
        message = ChatUserMessage(role="user", content=[text_content_block_from_string(wrapped)])
        return query, runtime, env, [*messages, message], extra_args


class FathVerify(BasePipelineElement):
    """Before the LLM reads them, every user message's tag is verified (constant-time compare); a message
    whose tag is missing, forged or moved is replaced by a notice and never reaches the model."""

    NOTICE = "[FATH: a message without a valid authentication tag was removed]"

    def __init__(self, session: FathSession, trace: EpisodeTrace) -> None:
        self.session = session
        self.trace = trace

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        updated = list(messages)
        for index, message in enumerate(messages):
            text = _text(message)
            if message["role"] != "user" or text == self.NOTICE:
                continue
            if verify_instruction(self.session.secret, text, index) is None:
                self.trace.rejected_instructions += 1
                updated[index] = ChatUserMessage(role="user", content=[text_content_block_from_string(self.NOTICE)])
        return query, runtime, env, updated, extra_args


class FathUntrustedTools(BasePipelineElement):
    """Each new tool output goes inside its own ``<data auth="...">`` tag (never the authorised one), with
    any FATH markup inside it defanged."""

    def __init__(self, session: FathSession, trace: EpisodeTrace) -> None:
        self.session = session
        self.trace = trace

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        updated = list(messages)
        for index in _trailing_tool_indices(messages):
            if index in self.session.wrapped_tools:
                continue
            text = _text(messages[index])
            self.session.wrapped_tools.add(index)
            self.trace.original_outputs.setdefault(index, text)
            wrapped = wrap_data(self.session.secret, text, index)
            updated[index] = {**messages[index], "content": [text_content_block_from_string(wrapped)]}  # type: ignore[typeddict-item]
        return query, runtime, env, updated, extra_args


def _call_key(call: FunctionCall) -> str:
    return json.dumps([call.function, dict(call.args)], sort_keys=True, default=str)


class FathResponse(BasePipelineElement):
    """FATH's rule-based parser, after every LLM call: only the authorised section of the reply is kept.

    - no section tagged for the user's instruction: the reply is rejected, its text replaced by
      ``FATH_REFUSAL`` and none of its tool calls executed (each recorded as blocked);
    - otherwise the reply becomes the authorised section: its tool calls are the ones written inside it
      (calls written anywhere else are blocked), and a reply with no call there is the final answer, the
      section's text without the markup.
    """

    def __init__(self, session: FathSession, trace: EpisodeTrace) -> None:
        self.session = session
        self.trace = trace

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        if not messages or messages[-1]["role"] != "assistant":
            return query, runtime, env, messages, extra_args
        index = len(messages) - 1
        last = messages[-1]
        written = list(last.get("tool_calls") or [])
        tag = self.session.authorised_tag
        section = authorised_section(_text(last), tag) if tag is not None else None
        self.trace.response_authenticated = section is not None
        if section is None:
            self.trace.rejected_replies += 1
            reason = "FATH: the reply has no section authenticated for the user's instruction"
            for call in written:
                self.trace.blocked.append(BlockedCall(index, call.function, dict(call.args), reason))
            reply = ChatAssistantMessage(
                role="assistant", content=[text_content_block_from_string(FATH_REFUSAL)], tool_calls=None
            )
            return query, runtime, env, [*messages[:-1], reply], extra_args
        step = sum(1 for message in messages if message["role"] == "assistant") - 1
        inside = parse_tool_calls(section, frozenset(runtime.functions), call_id_prefix=f"call-{step}")
        ids = {_call_key(call): call.id for call in written}
        calls = [
            FunctionCall(function=call.function, args=call.args, id=ids.get(_call_key(call), call.id))
            for call in inside
        ]
        kept = {_call_key(call) for call in calls}
        for call in written:
            if _call_key(call) not in kept:
                reason = "FATH: the call was written outside the section authenticated for the user's instruction"
                self.trace.blocked.append(BlockedCall(index, call.function, dict(call.args), reason))
        text = f'<response auth="{tag}">\n{section}\n</response>' if calls else section
        reply = ChatAssistantMessage(
            role="assistant", content=[text_content_block_from_string(text)], tool_calls=calls or None
        )
        return query, runtime, env, [*messages[:-1], reply], extra_args


Planner = Callable[[str, frozenset[str]], dict[str, str]]


class ToolGate(BasePipelineElement):
    """RVG: the verifier-gated tool boundary, in place of ``ToolsExecutor``.

    Each call of the last assistant message is checked against the benchmark's allowlist policy and the
    task's allowed tools. Those come either fixed (``task_tools``: a benchmark protocol's declared tool,
    or the answer key for ``rvg_oracle``) or from ``planner(request, declared tool names) -> {tool: why}``,
    run once, at the first tool call, on the user's request and the runtime's tool declarations only (the
    realistic gate: no tool output has any say). Allowed calls run through the wrapped executor; blocked
    calls are removed from the message's ``tool_calls`` (so no judge or trace sees them as executed),
    recorded in the trace, and the model gets a notice saying they were not executed.
    """

    def __init__(
        self,
        policy: ToolPolicy,
        task_tools: frozenset[str] | None,
        trace: EpisodeTrace,
        executor: BasePipelineElement | None = None,
        *,
        planner: Planner | None = None,
    ) -> None:
        if (task_tools is None) == (planner is None):
            raise ValueError("ToolGate takes exactly one of task_tools and planner")
        self.policy = policy
        self.task_tools = frozenset(task_tools) if task_tools is not None else None
        self.planner = planner
        self.trace = trace
        self.executor = executor or ToolsExecutor()

    def allowed_tools(self, query: str, runtime: FunctionsRuntime) -> frozenset[str]:
        if self.task_tools is None:
            assert self.planner is not None
            plan = self.planner(query, frozenset(runtime.functions))
            self.trace.planned_tools = dict(sorted(plan.items()))
            self.task_tools = frozenset(plan)
        return self.task_tools

    def check(self, call: FunctionCall, allowed: frozenset[str] | None = None) -> tuple[bool, str]:
        tools = allowed if allowed is not None else (self.task_tools or frozenset())
        return self.policy.decide(call.function, tools)

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        if not messages or messages[-1]["role"] != "assistant" or not messages[-1].get("tool_calls"):
            return query, runtime, env, messages, extra_args
        index = len(messages) - 1
        tools = self.allowed_tools(query, runtime)
        allowed: list[FunctionCall] = []
        notices: list[str] = []
        for call in messages[-1]["tool_calls"] or []:
            ok, reason = self.check(call, tools)
            if ok:
                allowed.append(call)
            else:
                self.trace.blocked.append(BlockedCall(index, call.function, dict(call.args), reason))
                notices.append(f"Tool boundary: the call to `{call.function}` was blocked and not executed ({reason}).")
        if not notices:
            return self.executor.query(query, runtime, env, messages, extra_args)
        gated = {**messages[-1], "tool_calls": allowed or None}
        query, runtime, env, executed, extra_args = self.executor.query(
            query, runtime, env, [*messages[:-1], gated], extra_args
        )  # type: ignore[list-item]
        notice = ChatUserMessage(role="user", content=[text_content_block_from_string("\n".join(notices))])
        return query, runtime, env, [*executed, notice], extra_args
