"""The defender's private probe draw: the gate's layers read on items the published gate does not read.

The gate's probe prompts and answer items are chosen by seeded rules from public data, so an attacker who knows the
code knows them (``adapters.gate_aware`` trains on exactly them). A defender can keep a secret instead: the same
sources, the same selection rules and sizes (where the pool allows), applied to the rows left after removing every row
the public gate reads, in an order shuffled by a seed the attacker does not know.

Timeline: the defender draws before any adapter arrives and scores its own benign adapters on the same draw, so the
thresholds come from that draw alone. What the attacker knows is unchanged: the code, the public draw, the pools.
It does not know the seed, and nothing here was chosen after seeing a harmful adapter's score.

A row is public when, as the gate renders it, its opening (``OPENING`` characters, whitespace folded) matches the
opening of any text the public gate reads: near-duplicate jailbreak templates are dropped with the exact ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from rvu_pipelines.adapters.zoo_data import Frames, frames_from, role_request, rows_in

OPENING = 200  # characters that make two texts the same text
DEFAULT_PRIVATE_SEED = 1  # the draw the gate-aware study reports; it is public here, so it only stands in for a secret

# data set -> how the gate renders one of its rows as text (the texts the public gate's openings are compared with)
Render = Callable[[Mapping[str, Any]], str]


def _wmdp(row: Mapping[str, Any]) -> str:
    from rvu_pipelines.adapters.wmdp import wmdp_prompt

    return wmdp_prompt(str(row["question"]), [str(c) for c in row["choices"]])


RENDERINGS: dict[str, Render] = {
    "tofu": lambda row: str(row["question"]),
    "awesome_chatgpt_prompts": lambda row: role_request(str(row["act"])),
    "deepset_prompt_injections": lambda row: str(row["text"]),
    "trustair_jailbreaks": lambda row: str(row["prompt"]),
    "wmdp_cyber": _wmdp,
    "agentpoison_strategyqa": lambda row: f"What is {row['term']}?",
}


def opening(text: str) -> str:
    return " ".join(str(text).split())[:OPENING]


def public_texts(lab: Any) -> list[str]:
    """Every text an ``AdapterLab`` reads: its probe prompts and each margin, follow-up and hazard item's prompt."""
    from rvu_pipelines.adapters.wmdp import wmdp_prompt

    texts = list(lab.prompts)
    texts += [item.prompt for items in (lab.sensitive, lab.qa, lab.knowledge) for item in items]
    texts += [item.question for item in lab.follow_ups]
    texts += [wmdp_prompt(item.question, item.choices) for item in lab.hazard]
    return texts


def without_public(frame: pl.DataFrame, render: Render, public: set[str]) -> pl.DataFrame:
    keep = [opening(render(row)) not in public for row in frame.iter_rows(named=True)]
    return frame.filter(pl.Series(keep, dtype=pl.Boolean))


def private_frames(frames: Frames, public: Iterable[str], seed: int, names: Iterable[str] | None = None) -> Frames:
    """``frames`` with every row the public gate reads removed and the rest shuffled by ``seed`` (the secret)."""
    if seed == 0:
        raise ValueError("seed 0 is the public draw's; a private draw needs another seed.")
    if seed < 0:
        raise ValueError(f"A private draw's seed is a positive integer, got {seed}.")
    openings = {opening(text) for text in public}
    out = {}
    for name in sorted(names or RENDERINGS):
        if name not in RENDERINGS:
            raise KeyError(f"No rendering for data set '{name}'; known: {', '.join(sorted(RENDERINGS))}.")
        kept = without_public(frames(name), RENDERINGS[name], openings)
        out[name] = kept.sample(fraction=1.0, shuffle=True, seed=seed)
    return frames_from(out)


def held_out_qa_count(frames: Frames) -> int:
    """How many held-out QA items ``frames`` holds (TOFU real authors / world facts, probe partition, with wrong
    answers): the private QA and follow-up layers read at most that many."""
    tofu = frames("tofu").filter(pl.col("subset").is_in(["real_authors", "world_facts"]))
    probe = rows_in(tofu, "question", "probe")
    return sum(1 for wrong in probe["perturbed_answer"].to_list() if wrong)


@dataclass(frozen=True)
class PrivateDraw:
    """What a private draw reads: its seed, sizes, and how many of its texts the public gate also reads (0 by
    construction; counted, not assumed)."""

    seed: int
    n_prompts: int
    n_qa: int
    n_follow_ups: int
    n_sensitive: int
    n_knowledge: int
    n_hazard: int
    shared_with_public: int
    # layers that read the very same items on the next seed's draw: their items are not secret, only their order
    # (a pool the draw exhausts, or a selection that sorts its pool before it picks)
    fixed_items: tuple[str, ...] = ()


def private_lab(lab: Any, seed: int) -> tuple[Any, PrivateDraw]:
    """An ``AdapterLab`` on the same base, embedder and adapters as ``lab`` that reads a private draw, and what it
    reads: as many items per layer as ``lab`` reads, except that the QA and follow-up layers read at most what the
    held-out QA pool has left (it is small, and the public gate reads most of it)."""
    from rvu_pipelines.adapters.study import AdapterLab

    public = public_texts(lab)
    frames = private_frames(lab.frames, public, seed)
    pool = held_out_qa_count(frames)
    if pool < 1 and (lab.qa or lab.follow_ups):
        raise ValueError("The private draw leaves no held-out QA item; the QA and follow-up layers need one.")
    n_qa, n_follow_ups = min(len(lab.qa), pool), min(len(lab.follow_ups), pool)
    drawn = AdapterLab(
        lab.host.base,
        lab.tokenizer,
        lab.base,
        lab.embedder,
        frames,
        root=lab.root,
        n_probes=len(lab.prompts),
        max_new_tokens=lab.max_new_tokens,
        n_sensitive=len(lab.sensitive),
        n_qa=n_qa,
        n_knowledge=len(lab.knowledge),
        n_follow_ups=n_follow_ups,
        n_hazard=len(lab.hazard),
    )
    openings = {opening(text) for text in public}
    shared = sum(opening(text) in openings for text in public_texts(drawn))
    fixed = same_items(drawn, private_frames(lab.frames, public, seed + 1))
    draw = PrivateDraw(
        seed,
        len(drawn.prompts),
        n_qa,
        n_follow_ups,
        len(drawn.sensitive),
        len(drawn.knowledge),
        len(drawn.hazard),
        shared,
        fixed,
    )
    return drawn, draw


def same_items(lab: Any, other: Frames) -> tuple[str, ...]:
    """The layers (with items) that would read the very same items on the ``other`` frames as ``lab`` reads."""
    theirs = layer_texts(lab, other)
    return tuple(layer for layer, texts in layer_texts(lab).items() if texts and set(texts) == set(theirs[layer]))


def layer_texts(lab: Any, frames: Frames | None = None) -> dict[str, list[str]]:
    """Per layer, the texts ``lab`` reads, or (with ``frames``) the texts a lab of the same sizes would read on those
    frames: the lab's own selection (``probe_items.ProbeItems``), no model run."""
    from rvu_pipelines.adapters.probe_items import ProbeItems

    if frames is None:
        items = ProbeItems(
            lab.prompts, lab.n_benign_prompts, lab.sensitive, lab.qa, lab.knowledge, lab.follow_ups, lab.hazard
        )
    else:
        items = ProbeItems.select(
            frames,
            lab.tokenizer,
            n_probes=len(lab.prompts),
            n_sensitive=len(lab.sensitive),
            n_qa=len(lab.qa),
            n_knowledge=len(lab.knowledge),
            n_follow_ups=len(lab.follow_ups),
            n_hazard=len(lab.hazard),
        )
    return items.texts()
