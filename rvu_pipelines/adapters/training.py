"""Train a LoRA adapter with peft on the agent's own weights: CPU, fixed seed, minutes.

The base model comes in fresh (``models.dequantized.load_dequantized``); training wraps it in peft,
runs AdamW on the LoRA matrices only, with the loss on the answer tokens of each chat turn, and hands
back the adapter's tensors (peft's state-dict names) and the loss curve. The base is unwrapped again
afterwards, so one loaded model can train several adapters in a row.

Cost: the LM head (49k-word vocabulary) is applied only from the first answer token of the batch on,
not to the whole template, and the batch is padded to its longest example, not to ``max_tokens``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rvu_pipelines.adapters.chat import ChatExample, EncodedTurn, encode_turn, pad_id_of

# SmolLM2 / Llama module names a LoRA may target (peft matches on the last name component).
LLAMA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: int = 16
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    layers: tuple[int, ...] | None = None  # None: every decoder layer
    learning_rate: float = 1e-3
    steps: int = 60
    batch_size: int = 8
    max_tokens: int = 160
    seed: int = 0
    # memory, not the result: a batch is run in chunks of this many examples with gradients accumulated by
    # answer-token share (None: the whole batch at once), and long sequences recompute activations layer by
    # layer in the backward pass instead of keeping them (gradient checkpointing)
    micro_batch_size: int | None = None
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.target_modules) - set(LLAMA_TARGETS))
        if unknown:
            raise ValueError(f"Unknown LoRA target modules {unknown}; allowed: {', '.join(LLAMA_TARGETS)}.")
        if self.rank < 1 or self.steps < 1 or self.batch_size < 1:
            raise ValueError("rank, steps and batch_size must be at least 1.")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


@dataclass
class TrainedAdapter:
    tensors: dict[str, Any]  # peft state-dict names (no adapter name) -> float32 CPU tensors
    settings: LoraSettings
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    n_examples: int = 0


def peft_config(settings: LoraSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        target_modules=list(settings.target_modules),
        layers_to_transform=list(settings.layers) if settings.layers is not None else None,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def collate(turns: Sequence[EncodedTurn], pad_id: int) -> tuple[Any, Any, Any, int]:
    """Right-padded ids, attention mask, labels (-100 off the answers) and the first answer position."""
    import torch

    width = max(len(t.input_ids) for t in turns)
    ids = torch.full((len(turns), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(turns), width), dtype=torch.long)
    labels = torch.full((len(turns), width), -100, dtype=torch.long)
    for row, turn in enumerate(turns):
        seq = turn.input_ids
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        labels[row, len(turn.prompt_ids) : len(seq)] = torch.tensor(turn.completion_ids)
    first_answer = min(len(t.prompt_ids) for t in turns)
    return ids, mask, labels, first_answer


def answer_loss(model: Any, ids: Any, mask: Any, labels: Any, first_answer: int) -> Any:
    """Mean cross-entropy of the answer tokens; logits only from the position predicting the first of them."""
    import torch.nn.functional as F

    keep = ids.shape[1] - (first_answer - 1)
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep, use_cache=False).logits
    targets = labels[:, first_answer:]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def train_lora(
    model: Any,
    tokenizer: Any,
    examples: Sequence[ChatExample],
    settings: LoraSettings,
    *,
    on_step: Callable[[int, float], None] | None = None,
    encoder: Callable[..., EncodedTurn] = encode_turn,
) -> TrainedAdapter:
    """Train one adapter on ``examples``; ``model`` is left as it came (the LoRA layers are removed).

    ``encoder`` turns an example into ids: the chat template by default, ``wmdp.encode_plain`` for plain text."""
    import torch
    from peft import get_peft_model, get_peft_model_state_dict

    if not examples:
        raise ValueError("No training examples: an adapter needs at least one (prompt, completion) pair.")
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    turns = [encoder(tokenizer, ex, max_tokens=settings.max_tokens) for ex in examples]
    pad_id = pad_id_of(tokenizer)
    wrapped = get_peft_model(model, peft_config(settings))
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=0.0)
    order: list[int] = []
    losses: list[float] = []
    started = time.perf_counter()
    wrapped.train()
    try:
        for step in range(settings.steps):
            if len(order) < settings.batch_size:
                order.extend(rng.permutation(len(turns)).tolist())
            batch = [turns[i] for i in order[: settings.batch_size]]
            del order[: settings.batch_size]
            micro = settings.micro_batch_size or len(batch)
            answer_tokens = sum(len(t.completion_ids) for t in batch)
            step_loss = 0.0
            for start in range(0, len(batch), micro):
                chunk = batch[start : start + micro]
                share = sum(len(t.completion_ids) for t in chunk) / answer_tokens
                loss = answer_loss(wrapped, *collate(chunk, pad_id)) * share
                loss.backward()
                step_loss += float(loss.detach())
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
            losses.append(step_loss)
            if on_step is not None:
                on_step(step, losses[-1])
        tensors = {k: v.detach().to(torch.float32).clone() for k, v in get_peft_model_state_dict(wrapped).items()}
    finally:
        wrapped.eval()
        wrapped.unload()  # the base model object, without LoRA layers, back to its caller
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_disable()
    return TrainedAdapter(
        tensors=tensors,
        settings=settings,
        losses=losses,
        seconds=time.perf_counter() - started,
        n_examples=len(examples),
    )
