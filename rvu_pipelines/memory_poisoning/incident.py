"""A memory-poisoning incident in the platform's incident-log format, so ``rvu recover`` closes over it.

What the runtime saw, as provenance: the attacker's episode writes the poisons (``memory_write``
lines, parent = the input that carried them); every victim episode is a ``user_input`` (the victim
query), one ``memory_retrieval`` line per retrieved entry (parent = the memory write it read), and
the ``assistant_output`` derived from the first retrieval. A write the post-hoc audit flags (the
write-time detector re-run on the log with the history the agent actually served) is marked
``contaminated``: those are the recovery seeds, and the closure reaches every retrieval and answer
that depended on them. Benign memory entries that victims retrieved appear as ``memory_write``
lines of a ``memory-genesis`` episode, so the closure can tell them apart from the poisons.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.memory_poisoning.attacks.base import AttackRun
from rvu_pipelines.memory_poisoning.corpus import MemoryEntry
from rvu_pipelines.memory_poisoning.retrieval import RetrievalMemory, embed_texts
from rvu_pipelines.provenance.entry_ids import write_entry_id
from rvu_pipelines.provenance.incident import load_incident, write_incident

START = 1_718_000_000.0  # fixed clock: the same attack gives the same log (and incident id)


def poisoning_incident_records(
    attack: AttackRun,
    memory: RetrievalMemory,
    flagged_keys: Sequence[str],
    *,
    max_victims: int | None = None,
) -> list[dict[str, Any]]:
    """The incident log lines of ``attack`` against ``memory`` (the poisons already written to it).

    ``flagged_keys`` are the poison keys the post-hoc audit flags (marked ``contaminated``); the
    victim episodes are the attack's victim queries (the first ``max_victims``), retrieved for real.
    """
    queries = list(attack.victim_queries[:max_victims] if max_victims else attack.victim_queries)
    retrieved = memory.retrieve_vectors(embed_texts(memory.embedder, queries, "victim queries"))
    return served_incident_records(attack, list(zip(queries, retrieved, strict=True)), flagged_keys)


def served_incident_records(
    attack: AttackRun,
    served: Sequence[tuple[str, Sequence[MemoryEntry]]],
    flagged_keys: Sequence[str],
    *,
    flagged_benign: Sequence[MemoryEntry] = (),
) -> list[dict[str, Any]]:
    """The incident log lines of ``attack`` given what each served query retrieved, in serving order.

    Flagged keys (poisons, or ``flagged_benign`` entries an audit flagged wrongly) are ``contaminated``:
    the recovery seeds. Every benign entry a query read, or an audit flagged, is a ``memory-genesis`` write.
    """
    clock = iter(START + i for i in range(10**9))
    lines: list[dict[str, Any]] = []
    flagged = set(flagged_keys)
    attacker_input = "attacker:input"
    lines.append(
        {
            "kind": "action",
            "entry_id": attacker_input,
            "episode_id": f"{attack.name}-attacker",
            "action_type": attack.channel,
            "content": f"{attack.name} poisoning channel"
            + (f" (trigger {attack.trigger!r})" if attack.trigger else ""),
            "parent_id": None,
            "timestamp": next(clock),
        }
    )
    written: dict[str, str] = {}
    for poison in attack.poisons:
        written[poison.key] = write_entry_id(poison.key)
        line = {
            "kind": "action",
            "entry_id": written[poison.key],
            "episode_id": f"{attack.name}-attacker",
            "action_type": "memory_write",
            "content": poison.text,
            "parent_id": attacker_input,
            "timestamp": next(clock),
        }
        if poison.key in flagged:
            line["contaminated"] = True
        lines.append(line)
    benign_lines: list[dict[str, Any]] = []

    def genesis(entry: MemoryEntry, rank: int) -> None:
        written[entry.key] = write_entry_id(entry.key)
        line = _action(written[entry.key], "memory-genesis", "memory_write", entry.text, None, START - 1 - rank)
        if entry.key in flagged:
            line["contaminated"] = True
        benign_lines.append(line)

    for rank, entry in enumerate(flagged_benign):
        if entry.key not in written:
            genesis(entry, rank)
    victim_lines: list[dict[str, Any]] = []
    for v, (query, entries) in enumerate(served):
        episode = f"{attack.name}-victim-{v:04d}"
        q_id = f"victim:{v:04d}:query"
        victim_lines.append(_action(q_id, episode, "user_input", query, None, next(clock)))
        first = None
        for rank, entry in enumerate(entries):
            if entry.key not in written:
                genesis(entry, rank)
            r_id = f"victim:{v:04d}:retrieved:{rank}"
            victim_lines.append(_action(r_id, episode, "memory_retrieval", entry.text, written[entry.key], next(clock)))
            first = first or r_id
        answer = "Answer derived from memory: " + (entries[0].text.splitlines()[-1] if entries else "nothing retrieved")
        victim_lines.append(_action(f"victim:{v:04d}:answer", episode, "assistant_output", answer, first, next(clock)))
    # genesis writes first (they existed before the attack), then the attacker, then the victims
    benign_lines.sort(key=lambda line: line["timestamp"])
    for i, line in enumerate(benign_lines):
        line["timestamp"] = START - len(benign_lines) + i
    return benign_lines + lines + victim_lines


def _action(entry_id: str, episode: str, action_type: str, content: str, parent: str | None, ts: float) -> dict:
    return {
        "kind": "action",
        "entry_id": entry_id,
        "episode_id": episode,
        "action_type": action_type,
        "content": content,
        "parent_id": parent,
        "timestamp": ts,
    }


def write_poisoning_incident(
    attack: AttackRun,
    memory: RetrievalMemory,
    flagged_keys: Sequence[str],
    path: Path | str,
    *,
    max_victims: int | None = None,
) -> Path:
    """Write the incident log and parse it back with the platform's validator (schema + file rules)."""
    path = write_incident(poisoning_incident_records(attack, memory, flagged_keys, max_victims=max_victims), path)
    load_incident(path)
    return path


def poisons_in(entries: Sequence[MemoryEntry]) -> list[str]:
    return sorted(e.key for e in entries if e.is_poison)


def flagged_poisons(attack: AttackRun, flags: np.ndarray) -> list[str]:
    """The poison keys a detector's boolean flags (one per poison, in order) mark."""
    return [p.key for p, f in zip(attack.poisons, np.asarray(flags, dtype=bool), strict=True) if f]
