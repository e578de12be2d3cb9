"""Helpers every benchmark's scenarios share: running one episode through any AgentDojo pipeline,
reading tool calls and the final answer back out of its messages, recording which tools really ran,
and the fixed-seed sampling all benchmarks use.

Judges look at what *executed* (``ToolLog``), not at what the model asked for: a defense that blocks a
call to the attacker's tool stops the attack, so a blocked call must not count as a success.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.errors import AbortAgentError
from agentdojo.functions_runtime import EmptyEnv, Function, FunctionCall, FunctionsRuntime
from agentdojo.types import ChatMessage, get_text_content_as_str
from pydantic import BaseModel, ConfigDict, Field, create_model


@dataclass
class ToolLog:
    """The tool executions of one episode, in order (name, validated arguments)."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def first_index(self, name: str, after: int = -1) -> int | None:
        for i, (called, _) in enumerate(self.calls):
            if i > after and called == name:
                return i
        return None


class _LenientArgs(BaseModel):
    """Tool arguments: unknown keys are ignored, so a small model's extra argument is no error."""

    model_config = ConfigDict(extra="ignore")


def make_tool(
    name: str,
    description: str,
    parameters: dict[str, tuple[type, str]],
    result: Callable[[dict[str, Any]], str],
    log: ToolLog,
) -> Function:
    """An AgentDojo ``Function`` whose every execution is appended to ``log``.

    ``parameters`` maps a parameter name to (python type, description); every parameter is optional
    (default None) because the benchmarks' tools return a fixed response whatever the arguments.
    """
    fields: dict[str, Any] = {param: (kind | None, _field(desc)) for param, (kind, desc) in sorted(parameters.items())}
    model = create_model(f"{name}Args", __base__=_LenientArgs, **fields)

    def run(**kwargs: Any) -> str:
        log.calls.append((name, {k: v for k, v in sorted(kwargs.items()) if v is not None}))
        return result(kwargs)

    return Function(
        name=name,
        description=description,
        parameters=model,
        dependencies={},
        run=run,
        full_docstring=description,
        return_type=str,
    )


def _field(description: str) -> Any:
    return Field(default=None, description=description)


@dataclass(frozen=True)
class EpisodeTrace:
    """What one pipeline run left behind."""

    messages: list[ChatMessage]
    aborted: str | None  # the AbortAgentError message when a defense stopped the episode

    @property
    def answer(self) -> str:
        """The agent's final answer; none when a defense stopped the episode: AgentDojo closes it with the
        abort message as an assistant turn, which the model never wrote and no judge may score."""
        return "" if self.aborted is not None else final_answer(self.messages)


def run_pipeline(pipeline: BasePipelineElement, query: str, tools: Sequence[Function]) -> EpisodeTrace:
    """One episode on a fresh runtime; a defense's ``AbortAgentError`` ends it, it is not an error."""
    runtime = FunctionsRuntime(list(tools))
    try:
        _, _, _, messages, _ = pipeline.query(query, runtime, EmptyEnv(), [], {})
        return EpisodeTrace(list(messages), None)
    except AbortAgentError as exc:
        return EpisodeTrace(list(exc.messages), str(exc))


def requested_calls(messages: Sequence[ChatMessage]) -> list[FunctionCall]:
    """Every tool call the model asked for (executed or not), in order."""
    calls: list[FunctionCall] = []
    for message in messages:
        if message["role"] == "assistant":
            calls.extend(message.get("tool_calls") or [])
    return calls


def final_answer(messages: Sequence[ChatMessage]) -> str:
    """The text of the last message when it is the assistant's final answer, else ''.

    An assistant turn that still asks for a tool (the step budget ran out mid-task) is not an answer."""
    if not messages or messages[-1]["role"] != "assistant" or messages[-1].get("tool_calls"):
        return ""
    content = messages[-1].get("content")
    return get_text_content_as_str(content) if content else ""


def fixed_sample(n: int, limit: int | None, seed: int) -> list[int]:
    """Indices of a fixed-seed sample of ``limit`` out of ``n`` (all when None), in ascending order."""
    if limit is None or limit >= n:
        return list(range(n))
    if limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    return sorted(random.Random(seed).sample(range(n), limit))


def stable_choice(options: Sequence[str], *key: object) -> str:
    """A choice fixed by ``key`` alone (sha256), so an id means the same thing in every run."""
    digest = hashlib.sha256("/".join(map(str, key)).encode()).digest()
    return options[int.from_bytes(digest[:8], "big") % len(options)]
