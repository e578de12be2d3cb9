"""``hfer``: seed 004's spectral kill switch inline in the agent (arXiv 2511.05804).

:class:`SpectralKillSwitch` sits in the tool loop between tool execution and the LLM. Each new tool
output is read by the agent's own weights (transformers, the same GGUF llama.cpp runs) in the form the
switch was calibrated on (the user's request, a blank line, the tool output); when the calibrated
switch fires, the episode stops *before generation* with AgentDojo's ``AbortAgentError``, whose message
(the tool message index, layer, statistic and score) the episode runner records as the episode's
``aborted`` reason and whose closing assistant message lands in the episode's messages (and so in the
provenance log recovery reads). Nothing is rewritten: unlike ``classifier`` there is no filtered text.

``hfer_pipeline`` assembles the defense like ``classifier`` (system message, request, LLM, tool loop);
registering it as a Table 1 row (``scenarios.axes.DEFENSES`` and ``builder.build_pipeline``) is left
to the harness owners, since it changes the golden table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.basic_elements import InitQuery, SystemMessage
from agentdojo.agent_pipeline.errors import AbortAgentError
from agentdojo.agent_pipeline.tool_execution import ToolsExecutionLoop, ToolsExecutor
from agentdojo.functions_runtime import EmptyEnv, Env, FunctionsRuntime
from agentdojo.types import ChatMessage, get_text_content_as_str

from rvu_pipelines.agents.defenses.elements import DefensePipeline, EpisodeTrace
from rvu_pipelines.spectral.data import DOCUMENT_TEMPLATE

ABORT_PREFIX = "Spectral kill switch:"
DEFAULT_THRESHOLD = 0.5


def _text(message: ChatMessage) -> str:
    content = message.get("content")
    return get_text_content_as_str(content) if content else ""


def _new_tool_outputs(messages: Sequence[ChatMessage]) -> list[int]:
    indices = []
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] != "tool":
            break
        if _text(messages[index]).strip():
            indices.append(index)
    return sorted(indices)


def _request(messages: Sequence[ChatMessage], query: str) -> str:
    for message in messages:
        if message["role"] == "user":
            return _text(message)
    return query


class SpectralKillSwitch(BasePipelineElement):
    """Stops the episode before the LLM reads a tool output on which the calibrated switch fires."""

    name = "hfer_kill_switch"

    def __init__(self, detector: Any, threshold: float = DEFAULT_THRESHOLD) -> None:
        self.detector = detector  # an HferDetector (any InjectionDetector works; hfer is the point)
        self.threshold = float(threshold)
        self.scores: dict[int, float] = {}  # tool message index -> score, for every output read

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},  # noqa: B006 (AgentDojo's signature)
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        request = _request(messages, query)
        for index in _new_tool_outputs(messages):
            if index in self.scores:
                continue
            text = DOCUMENT_TEMPLATE.format(instruction=request) + _text(messages[index])
            score = float(self.detector.score([text])[0])
            self.scores[index] = score
            if score >= self.threshold:
                switch = getattr(self.detector, "switch", None)
                where = f"layer {switch.layer} {switch.statistic}" if switch is not None else self.detector.name
                raise AbortAgentError(
                    f"{ABORT_PREFIX} tool output (message {index}) fired at {where}, score {score:.3f} >= "
                    f"{self.threshold:.3f}; the episode stopped before generation.",
                    list(messages),
                    env,  # type: ignore[arg-type]
                )
        return query, runtime, env, messages, extra_args


def hfer_pipeline(
    llm_element: BasePipelineElement,
    detector: Any,
    *,
    system_prompt: str,
    first: BasePipelineElement | None = None,
    max_iters: int = 10,
    threshold: float = DEFAULT_THRESHOLD,
) -> DefensePipeline:
    """The ``hfer`` defense: the ``classifier`` layout with the kill switch in place of the filter.
    ``first`` is the first agent turn (the LLM, or a benchmark's pre-filled tool call)."""
    switch = SpectralKillSwitch(detector, threshold)
    elements: list[BasePipelineElement] = [
        SystemMessage(system_prompt),
        InitQuery(),
        first or llm_element,
        ToolsExecutionLoop([ToolsExecutor(), switch, llm_element], max_iters=max_iters),
    ]
    return DefensePipeline(elements, "hfer", EpisodeTrace())
