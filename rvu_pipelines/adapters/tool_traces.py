"""Tool-calling traces for the tool-use adapter: the agent's own prompt format.

At 135M the agent rarely calls a tool the way the harness parses it, so Table 1 cannot separate defenses.
The traces teach the format on data the evaluation does not use:

- AgentDojo **workspace** and **travel** user tasks (the evaluation runs banking and slack): each task's
  ground-truth calls are executed in the suite's default environment (no injection), and every step becomes
  one example — the conversation so far as the agent's chat model receives it (``llm_element.render_messages``:
  the system prompt with the suite's whole tool schema, the user's request, earlier calls and their results)
  and, as the answer, the next call as ``llm_element.render_call`` writes it.
- InjecAgent **user-tool calls** of the cases in the ``train`` partition (``partition.partition_of`` of the
  scenario id; the held-out evaluation uses ``probe`` cases): the user's instruction with the case's tools
  -> the user tool's call with the case's own arguments. Only the benign first step: no attacker call is
  ever a training answer.

An example's ``prompt`` holds the rendered conversation as JSON (a list of role/content messages) and is
encoded by ``encode_conversation`` with the model's chat template, exactly as llama.cpp will see it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rvu_pipelines.adapters.chat import ChatExample, EncodedTurn

TRAIN_SUITES = ("workspace", "travel")
HELD_OUT_SUITES = ("banking", "slack")


def conversation_example(messages: Sequence[Mapping[str, str]], answer: str) -> ChatExample:
    return ChatExample(json.dumps([dict(m) for m in messages], ensure_ascii=False, sort_keys=True), answer)


def encode_conversation(tokenizer: Any, example: ChatExample, max_tokens: int = 2048) -> EncodedTurn:
    """The conversation (``example.prompt``: JSON messages) through the chat template up to the assistant header,
    then the answer + end token. Too long: the conversation loses its oldest turns after the system prompt,
    never the system prompt with the tool schema."""
    messages = json.loads(example.prompt)
    end = tokenizer.eos_token or ""
    completion_ids = list(tokenizer(example.completion + end, add_special_tokens=False)["input_ids"])
    completion_ids = completion_ids[: max(1, max_tokens // 4)]
    while True:
        text = str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        prompt_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(prompt_ids) + len(completion_ids) <= max_tokens or len(messages) <= 2:
            break
        messages = [messages[0], *messages[2:]]  # drop the oldest turn after the system prompt
    room = max_tokens - len(completion_ids)
    return EncodedTurn(prompt_ids=prompt_ids[-room:], completion_ids=completion_ids)


def agentdojo_traces(
    suite_names: Sequence[str] = TRAIN_SUITES, *, benchmark_version: str | None = None, system_prompt: str | None = None
) -> list[ChatExample]:
    """One example per ground-truth call of every user task of ``suite_names`` (sorted task ids)."""
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.types import ChatAssistantMessage, ChatToolResultMessage, ChatUserMessage
    from agentdojo.types import text_content_block_from_string as block

    from rvu_pipelines.agents.llm_element import DEFAULT_SYSTEM_PROMPT, render_call, render_messages
    from rvu_pipelines.scenarios.agentdojo_tasks import suites

    if set(suite_names) & set(HELD_OUT_SUITES):
        raise ValueError(
            f"{sorted(set(suite_names) & set(HELD_OUT_SUITES))} are the evaluation's suites; train on others."
        )
    version = benchmark_version or _benchmark_version()
    system = system_prompt or DEFAULT_SYSTEM_PROMPT
    examples: list[ChatExample] = []
    for name in suite_names:
        suite = suites(version)[name]
        runtime = FunctionsRuntime(suite.tools)
        for task_id in sorted(suite.user_tasks, key=_task_number):
            task = suite.user_tasks[task_id]
            env = suite.load_and_inject_default_environment({})
            calls = task.ground_truth(env.model_copy(deep=True))
            messages: list[Any] = [ChatUserMessage(role="user", content=[block(task.PROMPT)])]
            for step, call in enumerate(calls):
                answer = render_call(call)
                examples.append(conversation_example(render_messages(messages, runtime.functions, system), answer))
                call = call.model_copy(update={"id": f"call-{step}-0"})
                result, error = runtime.run_function(env, call.function, dict(call.args))
                messages.append(ChatAssistantMessage(role="assistant", content=[block(answer)], tool_calls=[call]))
                messages.append(
                    ChatToolResultMessage(
                        role="tool",
                        content=[block(tool_result_to_str(result))],
                        tool_call_id=call.id,
                        tool_call=call,
                        error=error,
                    )
                )
    return examples


def injecagent_user_calls(*, system_prompt: str | None = None, partition: str = "train") -> list[ChatExample]:
    """The user-tool call of every InjecAgent case (both settings, one per distinct instruction) in ``partition``."""
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.types import ChatUserMessage
    from agentdojo.types import text_content_block_from_string as block

    from rvu_pipelines.adapters.partition import partition_of
    from rvu_pipelines.agents.llm_element import DEFAULT_SYSTEM_PROMPT, render_call, render_messages
    from rvu_pipelines.scenarios import scenarios_for
    from rvu_pipelines.scenarios.common import ToolLog

    system = system_prompt or DEFAULT_SYSTEM_PROMPT
    examples: list[ChatExample] = []
    seen: set[str] = set()
    for benchmark in ("injecagent_dh", "injecagent_ds"):
        cases: list[Any] = scenarios_for(benchmark, None)  # InjecAgentScenario: tools(), prefill_calls
        for scenario in cases:
            if partition_of(scenario.user_task) != partition or scenario.user_task in seen:
                continue
            seen.add(scenario.user_task)
            runtime = FunctionsRuntime(scenario.tools(ToolLog()))
            messages = [ChatUserMessage(role="user", content=[block(scenario.user_task)])]
            rendered = render_messages(messages, runtime.functions, system)
            examples.append(conversation_example(rendered, render_call(scenario.prefill_calls[0])))
    return examples


def held_out(scenario: Any) -> bool:
    """Whether the tool-use adapter's evaluation may use ``scenario``: AgentDojo banking / slack, InjecAgent
    cases whose instruction is in the ``probe`` partition."""
    from rvu_pipelines.adapters.partition import partition_of

    if scenario.benchmark.startswith("injecagent"):
        return partition_of(scenario.user_task) == "probe"
    return any(f"/{suite}/" in f"/{scenario.scenario_id}/" for suite in HELD_OUT_SUITES)


def _task_number(task_id: str) -> tuple[int, str]:
    tail = task_id.rsplit("_", 1)[-1]
    return (int(tail), task_id) if tail.isdigit() else (10**9, task_id)


def _benchmark_version() -> str:
    from rvu_pipelines.scenarios.registry import load_benchmarks_config

    return str(load_benchmarks_config().agentdojo_version)
