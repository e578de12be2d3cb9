"""Selective divergence: how much more an adapter changes what the model says to adversarial prompts than to benign
ones, read without any payload string.

A compliance backdoor camouflaged against the gate keeps the base's answers to benign questions and changes its
answers to injections and jailbreaks; a style or task adapter changes both alike. Per probe prompt the distance is
``1 − cos`` between the sentence embeddings of the base's greedy answer and the adapted model's (``influence.py``
computes it), and the statistic is the mean over the adversarial prompts minus the mean over the benign ones.

It is exploratory and no rule of the load gate reads it: an attacker who knows it spends the same divergence on
benign prompts (a style change on the benign probes' kinds), which moves the statistic back into the benign spread
and leaves the other layers to judge the adapter. The zoo's ``jailbreak-comply-selective-aware`` is that attacker
(``gate_aware``'s ``spend``); the research notes on seed 000 give what it keeps and where it lands.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def selective_divergence(distances: Sequence[float], n_benign: int) -> float:
    """Mean of ``distances[n_benign:]`` (adversarial prompts) minus mean of ``distances[:n_benign]`` (benign); NaN
    when the probes lack one of the halves (small frames), so an adapter's other scores are still written."""
    if not 0 <= n_benign <= len(distances):
        raise ValueError(f"{n_benign} benign probes cannot split {len(distances)} distances.")
    if n_benign in (0, len(distances)):
        return float("nan")
    values = np.asarray(distances, dtype=float)
    return float(values[n_benign:].mean() - values[:n_benign].mean())
