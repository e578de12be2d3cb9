"""``hfer``: seed 004's spectral kill switch inline in the agent (arXiv 2511.05804), a Table 1 defense.

:class:`SpectralKillSwitch` sits in the tool loop between tool execution and the LLM. Each new tool
output is read by the agent's own weights (transformers, the same GGUF llama.cpp runs) in the form the
switch was calibrated on (the user's request, a blank line, the tool output); when the calibrated
switch fires, the episode stops *before generation* with AgentDojo's ``AbortAgentError``. The switch
records the firing in the episode's :class:`EpisodeTrace` (``trace.abort``: which tool message, layer,
statistic, score, threshold, detector version), the episode runner stores the message as the row's
``aborted`` and the provenance log writes it as a ``defense_abort`` record whose parent is the tool
output that fired (marked contaminated: a recovery seed) in place of AgentDojo's closing assistant
message, which the model never wrote. Nothing is rewritten: unlike ``classifier`` there is no filtered
text.

``hfer_pipeline`` assembles the defense like ``classifier`` (system message, request, LLM, tool loop);
``builder.build_pipeline("hfer", ...)`` calls it with ``DefenseSettings.hfer_detector`` (by default the
profile's switch on the sink-free graph: layer and statistic from 20 examples of the contamination sets'
calibration split, threshold at 5 % FPR on clean tool outputs of AgentDojo's calibration tasks; loaded lazily:
``spectral.agent_switch``).
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

from rvu_pipelines.agents.defenses.elements import DefenseAbort, DefensePipeline, EpisodeTrace
from rvu_pipelines.agents.defenses.registry import EpisodeStart, defense_builder
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

    def __init__(self, detector: Any, threshold: float = DEFAULT_THRESHOLD, trace: EpisodeTrace | None = None) -> None:
        self.detector = detector  # an HferDetector (any InjectionDetector works; hfer is the point)
        self.threshold = float(threshold)
        self.trace = trace if trace is not None else EpisodeTrace()
        self.scores: dict[int, float] = self.trace.scored  # tool message index -> score, for every output read

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
                name = str(getattr(self.detector, "name", type(self.detector).__name__))
                where = f"layer {switch.layer} {switch.statistic}" if switch is not None else name
                reason = (
                    f"{ABORT_PREFIX} tool output (message {index}) fired at {where}, score {score:.3f} >= "
                    f"{self.threshold:.3f}; the episode stopped before generation."
                )
                self.trace.abort = DefenseAbort(
                    defense="hfer",
                    message_index=index,
                    score=score,
                    threshold=self.threshold,
                    detector=str(getattr(self.detector, "version", name)),
                    layer=None if switch is None else int(switch.layer),
                    statistic=None if switch is None else str(switch.statistic),
                    reason=reason,
                )
                raise AbortAgentError(reason, list(messages), env)  # type: ignore[arg-type]
        return query, runtime, env, messages, extra_args


def hfer_pipeline(
    llm_element: BasePipelineElement,
    detector: Any,
    *,
    system_prompt: str,
    first: BasePipelineElement | None = None,
    max_iters: int = 10,
    threshold: float = DEFAULT_THRESHOLD,
    trace: EpisodeTrace | None = None,
) -> DefensePipeline:
    """The ``hfer`` defense: the ``classifier`` layout with the kill switch in place of the filter.
    ``first`` is the first agent turn (the LLM, or a benchmark's pre-filled tool call); ``trace`` receives
    the switch's scores and abort."""
    trace = trace if trace is not None else EpisodeTrace()
    switch = SpectralKillSwitch(detector, threshold, trace)
    elements: list[BasePipelineElement] = [
        SystemMessage(system_prompt),
        InitQuery(),
        first or llm_element,
        ToolsExecutionLoop([ToolsExecutor(), switch, llm_element], max_iters=max_iters),
    ]
    return DefensePipeline(elements, "hfer", trace)


@defense_builder("hfer")
def _hfer(defense: str, start: EpisodeStart, scenario: Any, settings: Any) -> DefensePipeline:
    """The classifier's layout with the kill switch in place of the filter (``DefenseSettings.hfer_detector``)."""
    return hfer_pipeline(
        start.llm,
        settings.hfer_detector,
        system_prompt=settings.system_prompt,
        first=start.first,
        max_iters=settings.max_iters,
        threshold=settings.hfer_threshold,
        trace=start.trace,
    )
