"""Members and non-members of an adapter, rebuilt from its own manifest, for a membership test after eviction.

A zoo adapter's manifest records the digest of the examples it was trained on. ``zoo_membership_set``
rebuilds them with the zoo entry of the same id and takes them as members only when the digest matches:
a changed data set or zoo config would otherwise pass off examples the adapter never saw as its members.
The non-members are the same builder's held-out rows (``partition="probe"``; for the memorising adapter,
the other half of the forget set), so both sides come from one data set and one recipe and the test
measures membership, not a shift between data sets. When any of this cannot be done the answer is a
sentence saying why, which the recovery certificate carries in place of a measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.training import LoraSettings
from rvu_pipelines.adapters.zoo_data import PARTITIONED, Frames, PartitionedBuilder, wmdp_memorise
from rvu_pipelines.errors import RvuError

if TYPE_CHECKING:
    from rvu_pipelines.adapters.zoo import ZooConfig

# the builders that can build from the rows they hold out: every partitioned one, and the WMDP memoriser (the
# other half of its split; kept out of PARTITIONED, which names what a gate-aware recipe may wrap)
HELD_OUT: dict[str, PartitionedBuilder] = {**PARTITIONED, "wmdp_memorise": wmdp_memorise}

DEFAULT_CAP = 24  # per side: 2 x 24 answers scored twice is seconds on the tiny model, minutes on a larger one


@dataclass(frozen=True, eq=False)
class MembershipSet:
    """Examples with their member flags, and where each side came from (for the certificate)."""

    examples: list[ChatExample]
    is_member: np.ndarray
    origin: dict[str, Any]
    encoder: str = "chat"  # how the adapter read them in training (``zoo.encoder_of``)
    max_tokens: int = LoraSettings.max_tokens  # ... and where it cut them


MembersOf = Callable[[VerifiedAdapter], "MembershipSet | str"]


def _sample(n: int, size: int, seed: int) -> list[int]:
    return sorted(int(i) for i in np.random.default_rng(seed).choice(n, size=size, replace=False))


def zoo_membership_set(
    adapter: VerifiedAdapter,
    *,
    frames: Frames | None = None,
    config: ZooConfig | None = None,
    cap: int = DEFAULT_CAP,
    seed: int = 0,
) -> MembershipSet | str:
    """Up to ``cap`` members (a seeded sample of the rebuilt training set) and as many non-members (the same
    builder's held-out rows, minus any prompt the adapter trained on), or the reason there are none."""
    from rvu_pipelines.adapters.zoo import catalog_frames, load_zoo_config, training_set

    manifest = adapter.manifest
    recorded = manifest.training_data
    if recorded is None:
        return f"its manifest records no training data, so its members are unknown (adapter {manifest.adapter_id})"
    config = config or load_zoo_config()
    try:
        entry = config.get(manifest.adapter_id)
    except KeyError:
        return f"no zoo entry '{manifest.adapter_id}' to rebuild its training data from"
    source = held_out_source(entry.builder, entry.args)
    if isinstance(source, str):
        return f"builder '{entry.builder}' of zoo entry '{entry.id}' {source}"
    builder, builder_args = source
    frames = frames or catalog_frames()
    try:
        trained = training_set(config, entry, frames)
        recipe = builder(frames, builder_args)
        held = builder(frames, builder_args, partition="probe")
    except (RvuError, OSError, KeyError, ValueError) as exc:
        return f"its training data cannot be rebuilt here ({type(exc).__name__}: {exc})"
    if trained.sha256 != recorded.sha256:
        return (
            f"the rebuilt training set of '{entry.id}' has sha256 {trained.sha256[:12]}…, its manifest records "
            f"{recorded.sha256[:12]}…: the data or the zoo config changed since it was trained"
        )
    # members come from the recipe whose held-out rows are the non-members: a gate-aware adapter's camouflage
    # (other data sets) is left out, so both sides come from one data set
    own = {example.prompt for example in recipe.examples}
    candidates = [example for example in trained.examples if example.prompt in own]
    seen = {example.prompt for example in trained.examples}
    outside = [example for example in held.examples if example.prompt not in seen]
    size = min(cap, len(candidates), len(outside))
    if size < 2:
        return f"only {len(outside)} held-out rows of {held.dataset} for '{entry.id}': too few non-members"
    members = [candidates[i] for i in _sample(len(candidates), size, seed)]
    others = [outside[i] for i in _sample(len(outside), size, seed + 1)]
    whole = len(candidates) == len(trained.examples)
    of_recipe = "" if whole else f"; of them, the {len(candidates)} of its recipe ({recipe.selection})"
    resolved = entry.resolved(config.defaults)
    return MembershipSet(
        members + others,
        np.array([True] * size + [False] * size),
        {
            "source": "zoo",
            "zoo_entry": entry.id,
            "dataset": trained.dataset,
            "training_data_sha256": trained.sha256,
            "members": f"{size} of the {len(trained.examples)} training examples ({trained.selection}{of_recipe})",
            "non_members": f"{size} of {len(outside)} held-out rows ({held.selection})",
            "seed": seed,
            "encoder": entry.encoder,
        },
        encoder=entry.encoder,
        max_tokens=resolved.max_tokens,
    )


def held_out_source(builder: str, args: Mapping[str, Any]) -> tuple[PartitionedBuilder, Mapping[str, Any]] | str:
    """The builder (and its arguments) whose held-out rows are an adapter's non-members: its own, or for a
    gate-aware adapter the recipe it wraps; a sentence (after the builder's name) when there is none."""
    if builder == "gate_aware":
        from rvu_pipelines.adapters.gate_aware import wrapped_recipe

        try:
            name, inner = wrapped_recipe(args)
        except ValueError as exc:
            return f"wraps no recipe with held-out rows ({exc})"
        return HELD_OUT[name], inner
    found = HELD_OUT.get(builder)
    return (found, args) if found is not None else "holds no rows out to draw non-members from"
