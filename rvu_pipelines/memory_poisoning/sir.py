"""Multi-agent propagation of memory poisons (the paper's SIR study), on real memories and real detectors.

A population of agents each holds its own retrieval memory (a disjoint slice of the benign corpus).
At step 0 the attacker writes the initial poisons into one agent's memory through that agent's
write-time defense. At every step each agent serves one query drawn from the victim queries (with
probability ``victim_rate``; otherwise a benign query); an agent whose top-k holds a poison is
*infected* (and *exposed* from then on) and, acting on it, writes a secondary entry carrying the
poison's payload into the memories of ``contacts`` random peers, each through the peer's defense.
An infected agent recovers (its poisoned entries are purged, it is no longer infectious) with
probability ``recovery_rate`` per step: S -> I -> R, with reinfection possible if a peer writes again.

Every write is embedded with the real embedder and scored by the detector (calibrated before the
simulation on benign data only), so "MEMSAD stops the spread" is measured, not assumed. Curves are
the mean and standard deviation over ``seeds``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rvu_pipelines.atomic_write import write_stream_atomically
from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.corpus import MemoryEntry
from rvu_pipelines.memory_poisoning.defenses.base import WriteDetector
from rvu_pipelines.memory_poisoning.retrieval import RetrievalMemory, embed_texts
from rvu_pipelines.models.embedding import Embedder


@dataclass(frozen=True)
class SIRConfig:
    agents: int = 10
    steps: int = 30
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    contacts: int = 2
    victim_rate: float = 0.5
    recovery_rate: float = 0.1
    top_k: int = 5


@dataclass(frozen=True)
class SIRCurves:
    """Per defense: (seeds, steps + 1) arrays; index 0 is the state after the initial writes."""

    defense: str
    exposed: np.ndarray  # fraction of agents ever infected
    infected: np.ndarray  # fraction currently infected
    secondary: np.ndarray  # secondary poison entries committed so far
    initial_accepted: np.ndarray  # (seeds,) initial poisons that passed the first agent's defense
    writes_rejected: np.ndarray  # (seeds,) poisoned writes (initial + secondary) the defenses rejected

    def summary(self) -> dict[str, float]:
        return {
            "final_exposed_mean": float(self.exposed[:, -1].mean()),
            "final_exposed_std": float(self.exposed[:, -1].std()),
            "final_secondary_mean": float(self.secondary[:, -1].mean()),
            "final_secondary_std": float(self.secondary[:, -1].std()),
            "initial_accepted_mean": float(self.initial_accepted.mean()),
            "writes_rejected_mean": float(self.writes_rejected.mean()),
        }


def secondary_text(poison: MemoryEntry, agent: int, step: int) -> str:
    """The record an infected agent writes after acting on a retrieved poison: the poison's own record
    (question, reasoning, target), restated as what this agent learnt in this step."""
    return f"{poison.text.rstrip()}\n(Learnt by agent {agent} at step {step}.)\n"


def _check(config: SIRConfig, benign: Sequence[MemoryEntry], poisons: Sequence[MemoryEntry]) -> None:
    if config.agents < 2 or config.steps < 1 or not config.seeds:
        raise MemoryPoisoningInputError(
            f"the SIR simulation needs >= 2 agents, >= 1 step and >= 1 seed; got {config.agents}, "
            f"{config.steps}, {len(config.seeds)}"
        )
    if not 0 <= config.victim_rate <= 1 or not 0 <= config.recovery_rate <= 1:
        raise MemoryPoisoningInputError("victim_rate and recovery_rate are probabilities in [0, 1]")
    if len(benign) < config.agents * config.top_k:
        raise MemoryPoisoningInputError(
            f"{len(benign)} benign entries cannot fill {config.agents} agent memories of at least top_k = "
            f"{config.top_k} entries each; use a larger corpus or fewer agents"
        )
    if not poisons:
        raise MemoryPoisoningInputError("the SIR simulation needs at least one initial poison")


def simulate_sir(
    embedder: Embedder,
    benign: Sequence[MemoryEntry],
    poisons: Sequence[MemoryEntry],
    victim_queries: np.ndarray,
    benign_queries: np.ndarray,
    detector: WriteDetector | None,
    *,
    defense: str,
    config: SIRConfig = SIRConfig(),
    progress: Callable[[str], None] | None = None,
) -> SIRCurves:
    """Run the propagation ``len(config.seeds)`` times with ``detector`` guarding every write."""
    _check(config, benign, poisons)
    benign_vectors = embed_texts(embedder, [e.text for e in benign], "SIR benign memory")
    poison_vectors = embed_texts(embedder, [e.text for e in poisons], "SIR initial poisons")
    shape = (len(config.seeds), config.steps + 1)
    exposed, infected, secondary = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    initial_accepted = np.zeros(len(config.seeds))
    rejected = np.zeros(len(config.seeds))

    def admit(entries: list[MemoryEntry], vectors: np.ndarray) -> np.ndarray:
        if detector is None:
            return np.ones(len(entries), dtype=bool)
        return ~np.asarray(detector.flags(vectors, [e.text for e in entries]), dtype=bool)

    for s, seed in enumerate(config.seeds):
        rng = np.random.default_rng(seed)
        slices = np.array_split(rng.permutation(len(benign)), config.agents)
        memories = []
        for idx in slices:
            memory = RetrievalMemory(embedder, top_k=config.top_k)
            memory.add([benign[i] for i in sorted(idx)], benign_vectors[np.sort(idx)])
            memories.append(memory)
        ok = admit(list(poisons), poison_vectors)
        initial_accepted[s] = ok.sum()
        rejected[s] += (~ok).sum()
        first = int(rng.integers(config.agents))
        accepted = [p for p, a in zip(poisons, ok, strict=True) if a]
        if accepted:
            memories[first].add(
                [MemoryEntry(f"{p.key}@seed{seed}", p.text, p.origin) for p in accepted], poison_vectors[ok]
            )
        ever = np.zeros(config.agents, dtype=bool)
        now = np.zeros(config.agents, dtype=bool)
        n_secondary = 0
        for step in range(1, config.steps + 1):
            writes: list[tuple[int, MemoryEntry]] = []
            for agent in range(config.agents):
                pool = victim_queries if rng.random() < config.victim_rate else benign_queries
                query = pool[rng.integers(len(pool))][None, :]
                hit = next((e for e in memories[agent].retrieve_vectors(query)[0] if e.is_poison), None)
                if hit is not None:
                    now[agent] = ever[agent] = True
                    peers = rng.choice([a for a in range(config.agents) if a != agent], config.contacts, replace=False)
                    for peer in sorted(int(p) for p in peers):
                        key = f"secondary/{seed}/{step}/{agent}->{peer}"
                        writes.append((peer, MemoryEntry(key, secondary_text(hit, agent, step), hit.origin)))
            if writes:
                entries = [w for _, w in writes]
                vectors = embed_texts(embedder, [e.text for e in entries], "SIR secondary writes")
                ok = admit(entries, vectors)
                rejected[s] += (~ok).sum()
                for (peer, entry), vector, a in zip(writes, vectors, ok, strict=True):
                    if a:
                        memories[peer].add([entry], vector[None, :])
                        n_secondary += 1
            recovered = now & (rng.random(config.agents) < config.recovery_rate)
            for idle in np.flatnonzero(recovered).tolist():
                memories[idle].remove([e.key for e in memories[idle].live_entries() if e.is_poison])
            now &= ~recovered
            exposed[s, step], infected[s, step], secondary[s, step] = ever.mean(), now.mean(), n_secondary
        if progress:
            progress(f"SIR {defense}: seed {seed} done, exposed {ever.mean():.2f}, secondary {n_secondary}")
    return SIRCurves(defense, exposed, infected, secondary, initial_accepted, rejected)


def plot_sir(curves: Sequence[SIRCurves], path: str) -> str:
    """The paper's figure: exposed fraction (top) and secondary entries (bottom), mean +- 1 sd."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for c in curves:
        steps = np.arange(c.exposed.shape[1])
        for ax, data in ((axes[0], c.exposed), (axes[1], c.secondary)):
            mean, std = data.mean(axis=0), data.std(axis=0)
            ax.plot(steps, mean, label=c.defense)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    axes[0].set_ylabel("fraction of agents exposed")
    axes[1].set_ylabel("secondary poison entries")
    axes[1].set_xlabel("step")
    axes[0].legend()
    axes[0].set_title(f"Memory-poison propagation (mean ± 1 sd over {curves[0].exposed.shape[0]} seeds)")
    fig.tight_layout()
    write_stream_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=120))
    plt.close(fig)
    return path
