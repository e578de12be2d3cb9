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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.zoo_data import PARTITIONED, Frames
from rvu_pipelines.errors import RvuError

if TYPE_CHECKING:
    from rvu_pipelines.adapters.zoo import ZooConfig

DEFAULT_CAP = 24  # per side: 2 x 24 answers scored twice is seconds on the tiny model, minutes on a larger one


@dataclass(frozen=True, eq=False)
class MembershipSet:
    """Examples with their member flags, and where each side came from (for the certificate)."""

    examples: list[ChatExample]
    is_member: np.ndarray
    origin: dict[str, Any]


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
    if entry.encoder != "chat":
        return (
            f"zoo entry '{entry.id}' trains with the {entry.encoder} encoder, and the membership scores read "
            "answers through the chat template"
        )
    builder = PARTITIONED.get(entry.builder)
    if builder is None:
        return f"builder '{entry.builder}' of zoo entry '{entry.id}' holds no rows out to draw non-members from"
    frames = frames or catalog_frames()
    try:
        trained = training_set(config, entry, frames)
        held = builder(frames, entry.args, partition="probe")
    except (RvuError, OSError, KeyError, ValueError) as exc:
        return f"its training data cannot be rebuilt here ({type(exc).__name__}: {exc})"
    if trained.sha256 != recorded.sha256:
        return (
            f"the rebuilt training set of '{entry.id}' has sha256 {trained.sha256[:12]}…, its manifest records "
            f"{recorded.sha256[:12]}…: the data or the zoo config changed since it was trained"
        )
    seen = {example.prompt for example in trained.examples}
    outside = [example for example in held.examples if example.prompt not in seen]
    size = min(cap, len(trained.examples), len(outside))
    if size < 2:
        return f"only {len(outside)} held-out rows of {held.dataset} for '{entry.id}': too few non-members"
    members = [trained.examples[i] for i in _sample(len(trained.examples), size, seed)]
    others = [outside[i] for i in _sample(len(outside), size, seed + 1)]
    return MembershipSet(
        members + others,
        np.array([True] * size + [False] * size),
        {
            "source": "zoo",
            "zoo_entry": entry.id,
            "dataset": trained.dataset,
            "training_data_sha256": trained.sha256,
            "members": f"{size} of the {len(trained.examples)} training examples ({trained.selection})",
            "non_members": f"{size} of {len(outside)} held-out rows ({held.selection})",
            "seed": seed,
        },
    )
