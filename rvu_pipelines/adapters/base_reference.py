"""What the gate compares every adapter with, computed once per base model and probe set and kept on disk.

Scoring an adapter reads its outputs against the base model's on the same probes: the base's output embeddings (the
OOD layer's fit), its greedy answers (the behaviour layer), its answer margins on the sensitive, held-out QA and
knowledge-base items (the margin layers), its follow-up lines' likelihoods (the follow-up layer) and its answer
letters' likelihoods on the hazardous list (``hazard.py``). For one base
and one probe set these never change, yet a one-shot caller (``rvu adapters check``, a recovery that scores an
unscreened adapter) paid for them on every start: about as long as scoring the adapter itself. The cache is keyed
by exactly what they depend on: the base's sha256, the probe texts and items, the generation length, the torch /
transformers versions and the source of the code that computes them. Files are ``.npz`` archives read without
unpickling; an unreadable one is computed again and replaced.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import logging
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.adapters.follow_ups import FollowUpItem
from rvu_pipelines.adapters.margins import MarginItem
from rvu_pipelines.adapters.wmdp import WmdpItem

log = logging.getLogger(__name__)
FORMAT = 3
OPTIONAL = ("sensitive", "qa", "knowledge", "follow_ups", "hazard")  # arrays a lab without those items does not have


@dataclass(frozen=True, eq=False)
class BaseReference:
    embeddings: np.ndarray  # output embeddings of the probe prompts, one row per prompt
    answers: tuple[str, ...]  # greedy answers to the probe prompts
    sensitive: np.ndarray | None  # answer margins per sensitive item (None: the lab has no margin items)
    qa: np.ndarray | None  # answer margins per held-out QA item
    knowledge: np.ndarray | None = None  # answer margins per knowledge-base item
    follow_ups: np.ndarray | None = None  # (items, lines): each follow-up line's log-likelihood after each answer
    continuations: tuple[str, ...] = ()  # greedy text after each follow-up item's correct answer
    hazard: np.ndarray | None = None  # (items, 4): log p of each answer letter on the hazardous list
    from_cache: bool = False

    def to_bytes(self) -> bytes:
        arrays = {"embeddings": self.embeddings, "answers": np.array(self.answers, dtype=str)}
        arrays["continuations"] = np.array(self.continuations, dtype=str)
        arrays |= {name: value for name in OPTIONAL if (value := getattr(self, name)) is not None}
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> BaseReference:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with archive:
            return cls(
                embeddings=np.array(archive["embeddings"]),
                answers=tuple(str(a) for a in archive["answers"]),
                continuations=tuple(str(a) for a in archive["continuations"]),
                from_cache=True,
                **{name: np.array(archive[name]) if name in archive.files else None for name in OPTIONAL},
            )


def _code_digest() -> str:
    """The source of the functions a reference is computed with: a change to any of them is a new key."""
    from rvu_pipelines.adapters import chat, follow_ups, gate, hazard, margins, membership, wmdp

    digest = hashlib.sha256()
    for module in (chat, follow_ups, gate, hazard, margins, membership, wmdp):
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()


def reference_key(
    base_sha256: str,
    prompts: Sequence[str],
    max_new_tokens: int,
    sensitive: Sequence[MarginItem],
    qa: Sequence[MarginItem],
    knowledge: Sequence[MarginItem] = (),
    follow_ups: Sequence[FollowUpItem] = (),
    hazard: Sequence[WmdpItem] = (),
) -> str:
    """sha256 of everything a base reference depends on."""
    import torch
    import transformers

    def items(part: Sequence[MarginItem]) -> list[list[Any]]:
        return [[item.prompt, item.correct, list(item.wrong)] for item in part]

    record = {
        "format": FORMAT,
        "base_sha256": base_sha256,
        "prompts": list(prompts),
        "max_new_tokens": max_new_tokens,
        "sensitive": items(sensitive),
        "qa": items(qa),
        "knowledge": items(knowledge),
        "follow_ups": [[item.question, item.answer] for item in follow_ups],
        "hazard": [[item.question, list(item.choices), item.answer] for item in hazard],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "code": _code_digest(),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def compute_base_reference(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    sensitive: Sequence[MarginItem],
    qa: Sequence[MarginItem],
    knowledge: Sequence[MarginItem] = (),
    follow_ups: Sequence[FollowUpItem] = (),
    hazard: Sequence[WmdpItem] = (),
) -> BaseReference:
    from rvu_pipelines.adapters.chat import generate_greedy
    from rvu_pipelines.adapters.follow_ups import continuations_after_answers, follow_up_scores
    from rvu_pipelines.adapters.gate import output_embeddings
    from rvu_pipelines.adapters.hazard import letter_logliks
    from rvu_pipelines.adapters.margins import answer_margins

    return BaseReference(
        embeddings=output_embeddings(model, tokenizer, list(prompts)),
        answers=tuple(generate_greedy(model, tokenizer, list(prompts), max_new_tokens=max_new_tokens)),
        sensitive=answer_margins(model, tokenizer, sensitive) if sensitive else None,
        qa=answer_margins(model, tokenizer, qa) if qa else None,
        knowledge=answer_margins(model, tokenizer, knowledge) if knowledge else None,
        follow_ups=follow_up_scores(model, tokenizer, follow_ups) if follow_ups else None,
        continuations=tuple(continuations_after_answers(model, tokenizer, follow_ups)) if follow_ups else (),
        hazard=letter_logliks(model, tokenizer, hazard) if hazard else None,
    )


def base_reference(
    model: Any,
    tokenizer: Any,
    base_sha256: str,
    prompts: Sequence[str],
    max_new_tokens: int,
    sensitive: Sequence[MarginItem],
    qa: Sequence[MarginItem],
    cache_dir: Path | None,
    knowledge: Sequence[MarginItem] = (),
    follow_ups: Sequence[FollowUpItem] = (),
    hazard: Sequence[WmdpItem] = (),
) -> BaseReference:
    """The base reference from ``cache_dir`` when it holds one for exactly these inputs, else computed (and
    stored there). ``cache_dir=None``: always computed, nothing stored."""
    from rvu_pipelines.atomic_write import write_atomically

    if cache_dir is None:
        return compute_base_reference(
            model, tokenizer, prompts, max_new_tokens, sensitive, qa, knowledge, follow_ups, hazard
        )
    key = reference_key(base_sha256, prompts, max_new_tokens, sensitive, qa, knowledge, follow_ups, hazard)
    path = Path(cache_dir) / f"{key}.npz"
    if path.is_file():
        try:
            return BaseReference.from_bytes(path.read_bytes())
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # damaged: computed, replaced
            log.warning("base reference %s is unreadable (%s); computing it again", path, exc)
    reference = compute_base_reference(
        model, tokenizer, prompts, max_new_tokens, sensitive, qa, knowledge, follow_ups, hazard
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, reference.to_bytes())
    return reference
