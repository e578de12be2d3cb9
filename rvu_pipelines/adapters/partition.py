"""Which rows of a data set an adapter may train on and which are held out as probes.

A row's partition is a hash of its text, not a random draw, so it is the same on every machine and in
every row order; the zoo's builders, the tool-use traces and the evaluations all ask this one function.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Partition = Literal["train", "probe"]
PROBE_SHARE = 5  # one row in five is a probe row


def partition_of(text: str) -> Partition:
    """Stable across machines and row order: a hash of the text, not a random draw."""
    return "probe" if int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % PROBE_SHARE == 0 else "train"
