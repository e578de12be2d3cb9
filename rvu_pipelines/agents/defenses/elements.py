"""The defenses' AgentDojo pipeline elements and the per-episode trace they fill in.

``DetectorFilter`` (classifier), ``FathInitQuery`` / ``FathVerify`` / ``FathUntrustedTools`` /
``FathResponse`` (FATH) and ``ToolGate`` (RVG and the RVU defenses); each records what it did in an
:class:`EpisodeTrace`, which the episode runner reads for the counts and the provenance log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentdojo.agent_pipeline.agent_pipeline import AgentPipeline
from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.pi_detector import PromptInjectionDetector
from agentdojo.agent_pipeline.tool_execution import ToolsExecutor
from agentdojo.functions_runtime import EmptyEnv, Env, FunctionCall, FunctionsRuntime
from agentdojo.types import ChatMessage, ChatUserMessage, get_text_content_as_str, text_content_block_from_string

from rvu_pipelines.agents.defenses.allowlist import ToolPolicy
from rvu_pipelines.agents.defenses.fath import (
    RESPONSE_SECTION,
    authenticated_response,
    defang,
    verify_instruction,
    wrap_instruction,
)

FILTERED_NOTICE = "<Data omitted because a prompt injection was detected>"


# ------------------------------------------------------------------------------------------- trace


@dataclass(frozen=True)
class BlockedCall:
    """A call the tool boundary refused: the assistant message it came from, the call, why."""

    message_index: int
    function: str
    args: dict[str, Any]
    reason: str


@dataclass
class EpisodeTrace:
    """What the defense elements did during one episode (read by the provenance log and the counts)."""

    blocked: list[BlockedCall] = field(default_factory=list)
    # tool message index -> text before a defense changed it
    original_outputs: dict[int, str] = field(default_factory=dict)
    filtered: dict[int, float] = field(default_factory=dict)  # tool message index -> detector score (replaced)
    rejected_instructions: int = 0  # user messages whose FATH tag did not verify
    response_authenticated: bool | None = None  # FATH: the final answer carried a valid tag


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
    original is kept in the trace for the provenance log). Messages are copied, never mutated.
    """

    def __init__(self, detector: Any, threshold: float, trace: EpisodeTrace) -> None:
        super().__init__(mode="message", raise_on_injection=False)
        self.detector = detector
        self.threshold = float(threshold)
        self.trace = trace

    def detect(self, tool_output: str) -> tuple[bool, float]:
        score = float(self.detector.score([tool_output])[0])
        return score >= self.threshold, score

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
        scores = self.detector.score([_text(messages[i]) for i in indices])
        updated = list(messages)
        for index, score in zip(indices, [float(s) for s in scores], strict=True):
            if score >= self.threshold:
                self.trace.original_outputs.setdefault(index, _text(messages[index]))
                self.trace.filtered[index] = score
                updated[index] = {**messages[index], "content": self.transform(list(messages[index]["content"]))}  # type: ignore[typeddict-item]
        return query, runtime, env, updated, extra_args


class FathInitQuery(BasePipelineElement):
    """InitQuery for FATH: the user's query enters wrapped in its HMAC authentication tag."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        wrapped = wrap_instruction(self._key, query)
        message = ChatUserMessage(role="user", content=[text_content_block_from_string(wrapped)])
        return query, runtime, env, [*messages, message], extra_args


class FathVerify(BasePipelineElement):
    """Before the LLM reads them, every user message's tag is verified (constant-time compare);
    a message whose tag is missing or forged is replaced by a notice and never reaches the model."""

    NOTICE = "[FATH: a message without a valid authentication tag was removed]"

    def __init__(self, key: bytes, trace: EpisodeTrace) -> None:
        self._key = key
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
            if verify_instruction(self._key, text) is None:
                self.trace.rejected_instructions += 1
                updated[index] = ChatUserMessage(role="user", content=[text_content_block_from_string(self.NOTICE)])
        return query, runtime, env, updated, extra_args


class FathUntrustedTools(BasePipelineElement):
    """New tool outputs are wrapped as untrusted data, with any FATH markup inside them defanged."""

    def __init__(self, trace: EpisodeTrace) -> None:
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
            text = _text(messages[index])
            if text.startswith("<untrusted_data>"):
                continue
            self.trace.original_outputs.setdefault(index, text)
            wrapped = f"<untrusted_data>\n{defang(text)}\n</untrusted_data>"
            updated[index] = {**messages[index], "content": [text_content_block_from_string(wrapped)]}  # type: ignore[typeddict-item]
        return query, runtime, env, updated, extra_args


class FathResponse(BasePipelineElement):
    """After the loop: the answer is the section tagged for the user's instruction.

    A section with a wrong tag is dropped. A reply with no response section at all is kept as written
    (small models often ignore the format; refusing every such reply would measure formatting, not
    the defense) and the trace says the answer was not authenticated.
    """

    def __init__(self, key: bytes, trace: EpisodeTrace) -> None:
        self._key = key
        self.trace = trace

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        if not messages or messages[-1]["role"] != "assistant" or messages[-1].get("tool_calls"):
            return query, runtime, env, messages, extra_args
        text = _text(messages[-1])
        answer = authenticated_response(self._key, query, text)
        self.trace.response_authenticated = answer is not None
        if answer is None:
            if RESPONSE_SECTION.search(text) is None:
                return query, runtime, env, messages, extra_args
            answer = RESPONSE_SECTION.sub("", text).strip()  # only forged sections: drop them
        final = {**messages[-1], "content": [text_content_block_from_string(answer)]}
        return query, runtime, env, [*messages[:-1], final], extra_args  # type: ignore[list-item]


class ToolGate(BasePipelineElement):
    """RVG: the verifier-gated tool boundary, in place of ``ToolsExecutor``.

    Each call of the last assistant message is checked against the benchmark's allowlist policy and the
    scenario's task tools. Allowed calls run through the wrapped executor; blocked calls are removed from
    the message's ``tool_calls`` (so no judge or trace sees them as executed), recorded in the trace,
    and the model gets a notice saying they were not executed.
    """

    def __init__(
        self,
        policy: ToolPolicy,
        task_tools: frozenset[str],
        trace: EpisodeTrace,
        executor: BasePipelineElement | None = None,
    ) -> None:
        self.policy = policy
        self.task_tools = frozenset(task_tools)
        self.trace = trace
        self.executor = executor or ToolsExecutor()

    def check(self, call: FunctionCall) -> tuple[bool, str]:
        return self.policy.decide(call.function, self.task_tools)

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
        allowed: list[FunctionCall] = []
        notices: list[str] = []
        for call in messages[-1]["tool_calls"] or []:
            ok, reason = self.check(call)
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
