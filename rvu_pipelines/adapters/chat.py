"""One chat turn as token ids, split where the assistant's answer starts.

Training, membership scoring and the probes all see an example the same way: the model's chat template
with the prompt as the user turn and the answer as the assistant turn. Loss and membership scores are
taken on the answer's tokens only, so the split point is part of the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_SYSTEM = "You are a helpful assistant."


@dataclass(frozen=True)
class ChatExample:
    prompt: str
    completion: str

    def __post_init__(self) -> None:
        if not self.prompt.strip() or not self.completion.strip():
            raise ValueError("A training example needs a non-empty prompt and completion.")


@dataclass(frozen=True)
class EncodedTurn:
    """``prompt_ids`` ends with the template's assistant header; ``completion_ids`` is the answer + end token."""

    prompt_ids: list[int]
    completion_ids: list[int]

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


def chat_prompt_text(tokenizer: Any, prompt: str, system: str = DEFAULT_SYSTEM) -> str:
    """The template's text up to (and including) the assistant header, as generation would see it."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def encode_turn(
    tokenizer: Any, example: ChatExample, system: str = DEFAULT_SYSTEM, max_tokens: int = 256
) -> EncodedTurn:
    """Prompt and answer ids; an over-long prompt loses its start (the answer is what is scored)."""
    prompt_ids = list(
        tokenizer(chat_prompt_text(tokenizer, example.prompt, system), add_special_tokens=False)["input_ids"]
    )
    end = tokenizer.eos_token or ""
    completion_ids = list(tokenizer(example.completion + end, add_special_tokens=False)["input_ids"])
    completion_ids = completion_ids[: max(1, max_tokens // 2)]  # at most half the window
    room = max_tokens - len(completion_ids)
    if len(prompt_ids) > room:
        prompt_ids = prompt_ids[-room:]
    return EncodedTurn(prompt_ids=prompt_ids, completion_ids=completion_ids)
