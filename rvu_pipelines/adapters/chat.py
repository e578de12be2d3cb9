"""One chat turn as token ids, split where the assistant's answer starts.

Training, membership scoring and the probes all see an example the same way: the model's chat template
with the prompt as the user turn and the answer as the assistant turn. Loss and membership scores are
taken on the answer's tokens only, so the split point is part of the format.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def pad_id_of(tokenizer: Any) -> int:
    """The id batches are padded with: the tokenizer's pad token, else its end token."""
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)


def padded_batch(rows: Sequence[Sequence[int]], pad_id: int, left: bool = False) -> tuple[Any, Any]:
    """Ids and attention mask for rows of different lengths, padded on the right (or the left)."""
    import torch

    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[index, span] = torch.tensor(row)
        mask[index, span] = 1
    return ids, mask


def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 48,
    batch_size: int = 8,
    desc: str | None = None,
) -> list[str]:
    """Greedy chat-template answers (the agent's deterministic decoding), left-padded batches, new text only.
    With ``desc``, a progress bar (prompts) under that name: the full membership probes run for tens of minutes."""
    encoded = [list(tokenizer(chat_prompt_text(tokenizer, p), add_special_tokens=False)["input_ids"]) for p in prompts]
    return generate_greedy_ids(
        model, tokenizer, encoded, max_new_tokens=max_new_tokens, batch_size=batch_size, desc=desc
    )


def generate_greedy_ids(
    model: Any,
    tokenizer: Any,
    encoded: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 48,
    batch_size: int = 8,
    desc: str | None = None,
) -> list[str]:
    """``generate_greedy`` from token ids (e.g. a prompt with the assistant's turn already begun): the new text."""
    import torch
    from tqdm.auto import tqdm

    pad_id = pad_id_of(tokenizer)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    out = [""] * len(encoded)
    with tqdm(total=len(order), desc=desc, unit="prompt", disable=desc is None) as bar:
        for start in range(0, len(order), batch_size):
            batch = [encoded[i] for i in order[start : start + batch_size]]
            ids, mask = padded_batch(batch, pad_id, left=True)
            width = ids.shape[1]
            with torch.inference_mode():
                generated = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad_id,
                    eos_token_id=tokenizer.eos_token_id,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                )
            for row in range(len(batch)):
                text = tokenizer.decode(generated[row, width:], skip_special_tokens=True)
                out[order[start + row]] = text.strip()
            bar.update(len(batch))
    return out
