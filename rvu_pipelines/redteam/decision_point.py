"""Where an optimised string acts: the agent's prompt at the moment it has just read the injection.

A sentinel is planted right after the scenario's injection (through the scenario's own ``with_injection``), the
episode runs through a defense's real pipeline until the first LLM call whose prompt contains it, and that prompt
is rendered with the model's chat template and cut at the sentinel. So the optimiser sees exactly the prompt the
agent sees (system prompt, tool schema, the benchmark's pre-filled call, the defense's rewriting of tool output),
not a reconstruction. Earlier turns (AgentDojo: the agent reads the file itself) are answered by ``llm``.

The target is what the benchmark's judge counts as the attack's success, written as the agent writes a tool call
(:func:`rvu_pipelines.attacks.planted_call.target_text`). Where the judge needs more than one call (InjecAgent data
stealing: extract, then send), a later decision point is captured by answering the earlier ones with the goal's own
calls (``answers``): the prompt is then the one the agent meets after the extraction's result came back, the
injection and the string still in it, and the target is the next call.

Under a detector defense (``classifier``, ``hfer``) the capture runs the defense's pipeline with a detector that
lets everything through and keeps what it was given: the text the real detector would score, with the sentinel
where the string goes (:attr:`Capture.read`). That is what an attack adapted to the detector must get past.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rvu_pipelines.attacks.gcg import Slot
from rvu_pipelines.attacks.planted_call import target_text
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.models.llm import ChatCompletion, ChatModel, Message
from rvu_pipelines.scenarios.contract import Scenario

SENTINEL = "@@RVU-ATTACK-STRING@@"


class _Reached(BaseException):  # BaseException: no benchmark harness may swallow it as an episode error
    def __init__(self, messages: list[Message]) -> None:
        super().__init__("decision point reached")
        self.messages = messages


class _UntilSentinel:
    """A ChatModel that answers with ``inner`` until a prompt carries the sentinel, answers the first prompts that
    carry it with ``answers`` (the goal's earlier calls), then stops the episode at the next one."""

    def __init__(self, inner: ChatModel | None, answers: Sequence[str] = ()) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "decision-point")
        self.answers = list(answers)

    def chat(self, messages: list[Message], **kwargs: Any) -> ChatCompletion:
        if any(SENTINEL in str(m.get("content", "")) for m in messages):
            if self.answers:
                return ChatCompletion(self.answers.pop(0), self.name, 0, 0, 0.0, 0.0, "stop")
            raise _Reached([dict(m) for m in messages])
        if self.inner is None:
            raise ConfigError(
                "The agent must answer before it reads the injection (no pre-filled call): pass the agent's model."
            )
        return self.inner.chat(messages, **kwargs)


class _Reader:
    """A detector that flags nothing and keeps every text it was asked to score (in the order it read them)."""

    name = "decision-point-reader"
    version = "decision-point-reader"

    def __init__(self) -> None:
        self.texts: list[str] = []

    def score(self, texts: Sequence[str]) -> Any:
        import numpy as np

        self.texts += list(texts)
        return np.zeros(len(texts))


@dataclass(frozen=True)
class Capture:
    """A scenario's optimisation slot, and the texts with the sentinel that the defense's detector read."""

    slot: Slot
    read: tuple[str, ...]


def decision_messages(
    scenario: Scenario, defense: str, settings: Any, llm: ChatModel | None = None, answers: Sequence[str] = ()
) -> list[Message] | None:
    """The chat messages of the first LLM call that reads ``scenario``'s injection under ``defense`` (after
    ``answers`` answered the calls before it that read it); None when the agent never gets there (the episode ended
    first, or the defense removed the text)."""
    from rvu_pipelines.agents.defenses import build_pipeline  # runtime only: AgentDojo (seconds)

    capture = _UntilSentinel(llm, answers)
    try:
        scenario.run(build_pipeline(defense, capture, scenario, settings))
    except _Reached as reached:
        return reached.messages
    return None


def render_prompt(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The prompt text the runtime renders: the model's own chat template, the assistant turn opened."""
    return str(tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True))


def encode(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=False))


def capture(
    scenario: Scenario,
    tokenizer: Any,
    settings: Any,
    *,
    defense: str = "vanilla",
    llm: ChatModel | None = None,
    target: str | None = None,
    answers: Sequence[str] = (),
) -> Capture | None:
    """The optimisation slot of ``scenario`` under ``defense`` (the string goes right after the injection) and
    what the defense's detector read on the way (its detectors replaced by a reader that flags nothing, so the
    prompt is the one an undetected string meets); None when the agent never reads the injection there.
    ``answers``: the calls the agent made at the decision points before this one (a later stage of the goal); the
    slot is then named ``<scenario id>#<stage>``."""
    planted = scenario.with_injection(scenario.injection + SENTINEL)
    reader = _Reader()
    settings = dataclasses.replace(settings, detector=reader, hfer_detector=reader)
    messages = decision_messages(planted, defense, settings, llm, answers)
    if messages is None:
        return None
    prompt = render_prompt(tokenizer, messages)
    if prompt.count(SENTINEL) != 1:
        raise ConfigError(
            f"{scenario.scenario_id}: the injection appears {prompt.count(SENTINEL)} times in the agent's prompt; "
            "an optimised string needs exactly one place to act."
        )
    before, _, after = prompt.partition(SENTINEL)
    slot = Slot(
        f"{scenario.scenario_id}#{len(answers) + 1}" if answers else scenario.scenario_id,
        encode(tokenizer, before),
        encode(tokenizer, after),
        encode(tokenizer, target if target is not None else target_text(scenario)),
    )
    read = tuple(text for text in reader.texts if SENTINEL in text)
    if any(text.count(SENTINEL) != 1 for text in read):
        raise ConfigError(f"{scenario.scenario_id}: a text the {defense} detector reads holds the injection twice.")
    return Capture(slot, read)
