"""Greedy coordinate gradient (GCG, Zou et al. 2023) on the agent's own weights, resumable step by step.

The attacker owns a string of ``n_tokens`` tokens planted in the injection slot of one or more prompts
(:class:`Slot`: the token ids before the string, after it, and the target the agent should write next). Each step
takes the gradient of the target's cross-entropy with respect to a one-hot encoding of the string, proposes
``candidates`` single-token swaps among the ``top_k`` most promising tokens per position, scores every candidate
exactly (a batched forward pass) and keeps the best. Over several slots the loss is their mean, so one string is
optimised for many scenarios at once (the universal variant).

Cost is dominated by the candidate forward passes, so everything before the string is run once per slot and kept
as a key/value cache, and logits are computed only at the target positions. The state (string, losses, CPU
seconds) is written atomically after every step; a run killed anywhere resumes from its last finished step, and
each step's random choices depend only on (seed, step), so a resumed run is the run that was not interrupted.

An optional ``penalty`` scores candidate strings by their text (e.g. a detector's injection score, black-box) and
adds ``penalty_weight`` times it to the loss: the joint objective of an attack adapted to a text filter. With
``evade_below`` set, a string counts as solved only when its penalty is also below that value (the filter lets it
through), so the search goes on past a target it already reaches while the filter still catches it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from rvu_pipelines.atomic_write import atomic_path
from rvu_pipelines.errors import ConfigError

Penalty = Callable[[Sequence[str]], Sequence[float]]  # candidate strings -> a score to minimise, per string


@dataclass(frozen=True)
class Slot:
    """One prompt the string is optimised in: token ids before the string, after it, and the wanted reply."""

    slot_id: str
    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    target_ids: tuple[int, ...]


@dataclass(frozen=True)
class GcgConfig:
    n_tokens: int = 16
    steps: int = 60
    candidates: int = 64  # swaps scored exactly per step (the cost)
    top_k: int = 64  # most promising tokens per position the swaps are drawn from
    seed: int = 0
    init_token: str = " !"  # the string starts as n_tokens copies of this token
    penalty_weight: float = 0.0
    init_text: str = ""  # a warm start: the string starts with these tokens, padded with init_token to n_tokens
    evade_below: float = 0.0  # > 0: solved also needs the penalty below this (e.g. the defense's threshold)


@dataclass
class GcgState:
    """Everything a resumed run needs; written after every step."""

    fingerprint: str
    step: int
    token_ids: list[int]
    loss: float
    best_ids: list[int]
    best_loss: float
    losses: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0
    solved: bool = False  # every slot's target is the model's greedy reply (teacher-forced)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)


def problem_fingerprint(model_sha256: str, slots: Sequence[Slot], config: GcgConfig, penalty_key: str = "") -> str:
    """What decides the optimisation: the weights, every slot's ids, the settings and, with a penalty, what it
    scores (``penalty_key``: the detector's version and the texts it reads); a resume must match."""
    parts: list[object] = [
        model_sha256,
        [asdict(s) for s in slots],
        {k: v for k, v in asdict(config).items() if _decides(k, v)},
    ]
    if penalty_key:  # without one, the fingerprints of runs made before penalties were keyed
        parts.append(penalty_key)
    payload = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _decides(name: str, value: object) -> bool:
    """Whether a setting decides the optimisation's path (steps only say when to stop; an unset warm start or
    evasion bound keeps the fingerprints of runs made before they existed)."""
    return name != "steps" and not (name in ("init_text", "evade_below") and not value)


def allowed_tokens(tokenizer: Any) -> list[int]:
    """Token ids an attacker can plant as text: printable ASCII that decode to themselves, no special tokens.

    Keeping the search inside such tokens is what lets the string survive being written into a tool's output and
    tokenized again by the runtime."""
    special = set(tokenizer.all_special_ids)
    allowed = []
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id])
        if text and text.isascii() and text.isprintable() and text.strip() and "<|" not in text:
            allowed.append(token_id)
    return allowed


def _retokenizes(tokenizer: Any, ids: Sequence[int]) -> bool:
    return list(tokenizer.encode(tokenizer.decode(list(ids)), add_special_tokens=False)) == list(ids)


def target_outcome(model: Any, slot: Slot, ids: Sequence[int]) -> tuple[float, bool]:
    """The target's mean cross-entropy in ``slot`` with the string ``ids`` planted, and whether the target is the
    model's greedy reply there: one plain forward pass (no prefix cache), for checking a stored string on prompts
    it was not optimised on."""
    import torch

    tokens = [*slot.prefix_ids, *ids, *slot.suffix_ids, *slot.target_ids]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits
    n_target = len(slot.target_ids)
    start = len(tokens) - n_target - 1  # the position that predicts the first target token
    loss, exact = _target_scores(logits[:, start : start + n_target], slot.target_ids)
    return float(loss[0]), bool(exact[0])


def _target_scores(logits: Any, target_ids: Sequence[int]) -> tuple[Any, Any]:
    """Per row of ``logits`` (batch × target positions × vocabulary): the target's mean cross-entropy, and whether
    every target token is the argmax."""
    import torch

    targets = torch.tensor(list(target_ids)).expand(logits.shape[0], -1)
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(dim=1)
    return loss, (logits.argmax(dim=-1) == targets).all(dim=1)


class _PrefixCache:
    """The key/value states of a slot's prefix, run once; every forward gets a fresh cache expanded to its batch."""

    def __init__(self, model: Any, prefix_ids: Sequence[int]) -> None:
        import torch

        with torch.no_grad():
            out = model.model(torch.tensor([list(prefix_ids)]), use_cache=True)
        cache = out.past_key_values
        self.layers = [(layer.keys, layer.values) for layer in cache.layers]

    def expanded(self, batch: int) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache()
        for index, (keys, values) in enumerate(self.layers):
            cache.update(keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1), index)
        return cache


class GcgOptimizer:
    """GCG over ``slots`` on a transformers causal LM (the de-quantised copy of the agent's GGUF)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        slots: Sequence[Slot],
        config: GcgConfig,
        model_sha256: str,
        penalty: Penalty | None = None,
        penalty_key: str = "",
    ):
        import torch

        if not slots:
            raise ConfigError("GCG needs at least one slot (a scenario whose injection the agent reads).")
        self.model, self.tokenizer, self.slots, self.config = model, tokenizer, list(slots), config
        self.fingerprint = problem_fingerprint(model_sha256, slots, config, penalty_key if penalty else "")
        self.embeddings = model.get_input_embeddings().weight.detach()
        self.allowed = torch.tensor(allowed_tokens(tokenizer))
        self.caches = [_PrefixCache(model, slot.prefix_ids) for slot in self.slots]
        self.penalty = penalty

    def initial_ids(self) -> list[int]:
        ids = self.tokenizer.encode(self.config.init_token, add_special_tokens=False)
        if len(ids) != 1:
            raise ConfigError(f"GCG init_token {self.config.init_token!r} must be one token, it is {len(ids)}.")
        warm = self.tokenizer.encode(self.config.init_text, add_special_tokens=False) if self.config.init_text else []
        if len(warm) > self.config.n_tokens:
            raise ConfigError(
                f"GCG init_text {self.config.init_text!r} is {len(warm)} tokens, more than n_tokens "
                f"{self.config.n_tokens}; raise n_tokens or shorten the text."
            )
        return list(warm) + ids * (self.config.n_tokens - len(warm))

    # ------------------------------------------------------------------------------------------- losses

    def _slot_losses(self, index: int, candidates: Any) -> tuple[Any, Any]:
        """Per-candidate cross-entropy of slot ``index``'s target, and whether its greedy reply is the target."""
        import torch

        slot = self.slots[index]
        batch = candidates.shape[0]
        rest = torch.tensor(list(slot.suffix_ids) + list(slot.target_ids)).expand(batch, -1)
        hidden = self.model.model(
            torch.cat([candidates, rest], dim=1), past_key_values=self.caches[index].expanded(batch)
        ).last_hidden_state
        n_target = len(slot.target_ids)
        start = candidates.shape[1] + len(slot.suffix_ids) - 1  # the position that predicts the first target token
        return _target_scores(self.model.lm_head(hidden[:, start : start + n_target]), slot.target_ids)

    def losses(self, candidates: Any, chunk: int = 32) -> tuple[Any, Any]:
        """Mean target loss over all slots for each candidate (rows of token ids), and exact-match for all."""
        import torch

        totals, solved = [], []
        with torch.no_grad():
            for begin in range(0, candidates.shape[0], chunk):
                part = candidates[begin : begin + chunk]
                loss_sum = torch.zeros(part.shape[0])
                exact_all = torch.ones(part.shape[0], dtype=torch.bool)
                for index in range(len(self.slots)):
                    loss, exact = self._slot_losses(index, part)
                    loss_sum += loss
                    exact_all &= exact
                totals.append(loss_sum / len(self.slots))
                solved.append(exact_all)
        return torch.cat(totals), torch.cat(solved)

    def gradient(self, ids: Sequence[int]) -> Any:
        """d(mean target loss)/d(one-hot string), one row per string position."""
        import torch

        one_hot = torch.zeros(len(ids), self.embeddings.shape[0])
        one_hot[torch.arange(len(ids)), torch.tensor(list(ids))] = 1.0
        one_hot.requires_grad_(True)
        for index, slot in enumerate(self.slots):
            string = (one_hot @ self.embeddings)[None]  # per slot: each backward frees its own graph
            rest = self.embeddings[torch.tensor(list(slot.suffix_ids) + list(slot.target_ids))][None]
            hidden = self.model.model(
                inputs_embeds=torch.cat([string, rest], dim=1), past_key_values=self.caches[index].expanded(1)
            ).last_hidden_state
            start = len(ids) + len(slot.suffix_ids) - 1
            logits = self.model.lm_head(hidden[0, start : start + len(slot.target_ids)])
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor(list(slot.target_ids)))
            (loss / len(self.slots)).backward()
        assert one_hot.grad is not None
        return one_hot.grad

    # ------------------------------------------------------------------------------------------- search

    def propose(self, ids: Sequence[int], step: int) -> Any:
        """``candidates`` single-token swaps drawn from the top-k tokens of the gradient at a random position."""
        import torch

        grad = self.gradient(ids)[:, self.allowed]  # only plantable tokens
        top = self.allowed[(-grad).topk(min(self.config.top_k, grad.shape[1]), dim=1).indices]
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step)
        n = self.config.candidates
        positions = torch.randint(0, len(ids), (n,), generator=generator)
        choices = torch.randint(0, top.shape[1], (n,), generator=generator)
        candidates = torch.tensor(list(ids)).repeat(n, 1)
        candidates[torch.arange(n), positions] = top[positions, choices]
        keep = [i for i in range(n) if _retokenizes(self.tokenizer, candidates[i].tolist())]
        return candidates[keep] if keep else candidates[:1]

    def objective(self, candidates: Any) -> tuple[Any, Any]:
        """What the search minimises for each candidate: the target loss plus the weighted penalty; and whether
        the candidate solves the problem (every target greedy, and the penalty under ``evade_below`` if set)."""
        loss, solved = self.losses(candidates)
        if self.penalty is not None and self.config.penalty_weight:
            import torch

            texts = [self.tokenizer.decode(row.tolist()) for row in candidates]
            scores = torch.tensor(list(self.penalty(texts)), dtype=loss.dtype)
            loss = loss + self.config.penalty_weight * scores
            if self.config.evade_below:
                solved = solved & (scores < self.config.evade_below)
        return loss, solved

    def step(self, ids: Sequence[int], step: int) -> tuple[list[int], float, bool]:
        """One GCG step from ``ids``: the best candidate, its objective, and whether it solves the problem."""
        candidates = self.propose(ids, step)
        loss, solved = self.objective(candidates)
        best = int(loss.argmin())
        return candidates[best].tolist(), float(loss[best]), bool(solved[best])

    def run(self, state_path: Path, *, progress: bool = True, stop_when_solved: bool = True) -> GcgState:
        """Optimise up to ``config.steps`` steps, resuming from ``state_path`` when it holds this problem's state."""
        state = self._resume(state_path)
        if state is None:
            ids = self.initial_ids()
            loss, solved = self.objective(__import__("torch").tensor([ids]))
            state = GcgState(self.fingerprint, 0, ids, float(loss[0]), ids, float(loss[0]), [float(loss[0])])
            state.solved = bool(solved[0])
            _save(state_path, state)
        bar = tqdm(total=self.config.steps, initial=state.step, desc="GCG", unit="step", disable=not progress)
        while state.step < self.config.steps and not (stop_when_solved and state.solved):
            started = time.process_time()
            ids, loss, solved = self.step(state.token_ids, state.step)
            state.step += 1
            state.token_ids, state.loss, state.solved = ids, loss, solved
            state.losses.append(loss)
            if loss < state.best_loss or solved:
                state.best_ids, state.best_loss = ids, loss
            state.cpu_seconds += time.process_time() - started
            _save(state_path, state)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", best=f"{state.best_loss:.3f}")
        bar.close()
        return state

    def _resume(self, state_path: Path) -> GcgState | None:
        if not state_path.is_file():
            return None
        try:
            raw = json.loads(state_path.read_text(encoding="utf-8"))
            state = GcgState(**raw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"Cannot read the GCG state {state_path} ({exc}); delete it to start the optimisation afresh."
            ) from exc
        if state.fingerprint != self.fingerprint:
            return None  # another problem (weights, scenarios or settings changed): start afresh
        return state


def _save(path: Path, state: GcgState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temp:
        Path(temp).write_text(state.to_json(), encoding="utf-8")
