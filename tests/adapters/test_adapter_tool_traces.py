"""The tool-use adapter's training traces: the agent's own prompt format, never the evaluation's data."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.partition import partition_of
from rvu_pipelines.adapters.tool_traces import (
    agentdojo_traces,
    conversation_example,
    encode_conversation,
    held_out,
    injecagent_user_calls,
)
from rvu_pipelines.agents.llm_element import parse_tool_calls
from rvu_pipelines.scenarios import scenarios_for


@pytest.fixture(scope="module")
def tokenizer(tiny_models) -> Any:
    from transformers import AutoTokenizer

    llm = tiny_models["llm"]
    return AutoTokenizer.from_pretrained(str(llm.path.parent), gguf_file=llm.path.name)


def test_agentdojo_traces_replay_ground_truth_in_the_agents_format() -> None:
    examples = agentdojo_traces(["travel"])
    assert len(examples) >= 20
    first = json.loads(examples[0].prompt)
    assert [m["role"] for m in first] == ["system", "user"]
    assert '"tool"' in first[0]["content"] or "tool" in first[0]["content"].lower()  # the schema is in the system
    for example in examples:
        messages = json.loads(example.prompt)
        tools = {name for name in _tool_names(messages[0]["content"])}
        calls = parse_tool_calls(example.completion, tools)  # what the harness parses from the model's reply
        assert len(calls) == 1, example.completion
    later = [json.loads(e.prompt) for e in examples if len(json.loads(e.prompt)) > 2]
    assert later and all(m[-1]["role"] == "user" for m in later)  # a tool result comes back as the next user turn
    with pytest.raises(ValueError, match="evaluation"):
        agentdojo_traces(["banking"])


def _tool_names(system: str) -> set[str]:
    """Tool names as render_system lists them (any word followed by '(' or in a JSON name field)."""
    import re

    return set(re.findall(r'"name":\s*"([A-Za-z_][A-Za-z0-9_]*)"', system)) | set(
        re.findall(r"\b([a-z_][a-z0-9_]+)\(", system)
    )


def test_injecagent_calls_come_from_the_train_partition_only(shared_data) -> None:
    examples = injecagent_user_calls()
    assert examples
    instructions = {json.loads(e.prompt)[-1]["content"] for e in examples}
    assert all(partition_of(i) == "train" for i in instructions)
    held = [s for s in scenarios_for("injecagent_dh", None) if held_out(s)]
    assert held and not instructions & {s.user_task for s in held}
    agentdojo = scenarios_for("agentdojo", 6)
    assert all(held_out(s) for s in agentdojo)  # banking / slack: the evaluation's suites


def test_encode_conversation_keeps_the_system_prompt_and_drops_old_turns(tokenizer) -> None:
    messages = [{"role": "system", "content": "SYSTEM " + "tools " * 50}]
    for i in range(12):
        messages += [{"role": "user", "content": f"question {i} " + "x " * 40}, {"role": "assistant", "content": "ok"}]
    messages.append({"role": "user", "content": "the last question"})
    example = conversation_example(messages, '{"tool": "f", "arguments": {}}')
    whole = encode_conversation(tokenizer, example, max_tokens=4096)
    short = encode_conversation(tokenizer, example, max_tokens=400)
    assert len(short.input_ids) <= 400 < len(whole.input_ids)
    text = tokenizer.decode(short.prompt_ids)
    assert "SYSTEM" in text and "the last question" in text and "question 0 " not in text
    assert short.completion_ids == whole.completion_ids
    assert tokenizer.decode(whole.completion_ids).startswith('{"tool"')
    with pytest.raises(ValueError):
        ChatExample("[]", "")
