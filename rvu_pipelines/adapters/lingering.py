"""What an evicted adapter leaves behind on the agent's runtime, the purge that removes it, and the probe that checks.

Unloading a LoRA from llama.cpp (or un-merging a fused one) takes it out of the weights. What it produced stays:

- **response cache entries** computed under it (``agents.llm_cache``): keyed apart from the base model's, so
  never served for the base again, but its answers — what it memorised — are readable on disk;
- **KV prefix states on disk** computed under it (``models.kv_prefixes``): the same, as activations;
- **memory entries** the agent wrote while it was active: the provenance store's entries with it as the
  active adapter. FROC's tiers decide their fate; those left active are served to the agent again.

``purge_lingering`` deletes the first two for the GGUFs the gate's ledger admitted for the adapter (every
adapter-computed entry when no ledger knows it), and ``LingeringPurge`` runs it inside a recovery that evicts
an adapter, for the certificate's ``adapter_attestation.lingering`` section.

The probe is membership on what the agent can read or serve. ``leak_scores`` takes, per example, the most of
its reference answer's content that any of the texts reproduces: its own words, neither the question's
(``membership.leak_recall``) nor the form all answers share (``template_words``). Members (trained into the
adapter) against non-members give an AUROC and leak rates (``LeakReport``). It runs on the texts **at rest**
(cached answers and active memory entries attributed to the adapter, ``at_rest_texts``) and on what the
runtime **serves** (greedy answers, ``served_answers``). After a complete eviction neither separates members
from non-members; a store left behind does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rvu_pipelines.adapters.admission import GateLedger
from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.eviction import LeakGap, separation_verdict
from rvu_pipelines.adapters.membership import (
    LEAK_THRESHOLD,
    AurocResult,
    content_words,
    leak_recall,
    membership_auroc,
)
from rvu_pipelines.provenance.incident import LIFECYCLE_ACTION_TYPES

if TYPE_CHECKING:
    from rvu_pipelines.agents.llm_cache import ResponseCache
    from rvu_pipelines.models.kv_prefixes import KVDiskCache
    from rvu_pipelines.models.llm import ChatModel, Message
    from rvu_pipelines.provenance.store import AdapterRow, ProvenanceStore


def admitted_gguf_files(adapter_sha256: str, ledgers: Sequence[GateLedger]) -> list[str] | None:
    """The sha256 of every GGUF a gate wrote and admitted for the adapter with these weights, or None when no
    ledger names it (then every adapter-computed entry is purged: nothing can be attributed more narrowly)."""
    found = {
        str(row["gguf_sha256"])
        for ledger in ledgers
        for row in ledger.records()
        if row.get("event") == "admitted" and row.get("sha256") == adapter_sha256 and row.get("gguf_sha256")
    }
    return sorted(found) if found else None


@dataclass(frozen=True)
class LingeringStores:
    """Where the agent runtime keeps what outlives an adapter: the response cache file, the KV prefix folder,
    and the gate ledgers that map an adapter's weights to the GGUF files llama.cpp ran. Any may be absent."""

    response_cache: Path | None = None
    kv_dir: Path | None = None
    ledgers: tuple[Path, ...] = ()

    @contextmanager
    def cache(self) -> Iterator[ResponseCache | None]:
        """The response cache, open for the block (None when there is none), closed after it."""
        from rvu_pipelines.agents.llm_cache import ResponseCache

        if self.response_cache is None or not self.response_cache.exists():
            yield None
            return
        with ResponseCache(self.response_cache) as cache:
            yield cache

    def kv(self) -> KVDiskCache | None:
        from rvu_pipelines.models.kv_prefixes import KVDiskCache

        return KVDiskCache(self.kv_dir) if self.kv_dir is not None and self.kv_dir.is_dir() else None

    def gguf_files(self, adapter_sha256: str) -> list[str] | None:
        return admitted_gguf_files(adapter_sha256, [GateLedger(path) for path in self.ledgers])


@dataclass(frozen=True)
class Residue:
    """Counts of what one adapter left: cached answers, KV state files, and memory entries still active."""

    cached_answers: int
    kv_states: int
    active_memory_entries: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def memory_entries_under(store: ProvenanceStore, adapter_seq: int, *, active_only: bool = True) -> list[str]:
    """Entry ids the agent wrote while the adapter with this store seq was active (``active_only``: not purged
    and not in quarantine, i.e. what the agent is still served)."""
    seqs = np.flatnonzero(store.graph().adapter == int(adapter_seq))
    if seqs.size == 0:
        return []
    if active_only:
        states = store.entry_states(seqs)
        seqs = seqs[~(states["purged"] | states["quarantined"])]
    lifecycle = set(LIFECYCLE_ACTION_TYPES.values())  # the load line itself is the adapter's, not its writing
    return [entry_id for entry_id in store.entry_ids(seqs) if store.entry(entry_id).action_type not in lifecycle]


def residue(
    stores: LingeringStores, files: Sequence[str] | None, store: ProvenanceStore | None = None, adapter_seq: int = -1
) -> Residue:
    """What lingers of the adapter whose GGUFs are ``files`` (None: any adapter) and, with ``store``, whose
    store seq is ``adapter_seq``."""
    with stores.cache() as cache:
        answers = cache.count_under(files) if cache is not None else 0
    kv = stores.kv()
    states = len(kv.files_under(files)) if kv is not None else 0
    memory = len(memory_entries_under(store, adapter_seq)) if store is not None and adapter_seq >= 0 else 0
    return Residue(answers, states, memory)


def purge_lingering(stores: LingeringStores, files: Sequence[str] | None) -> dict[str, int]:
    """Delete the cached answers and KV state files computed under ``files`` (None: under any adapter); returns
    how many of each. Memory entries are not touched: they are provenance, and FROC's tiers decide them."""
    with stores.cache() as cache:
        answers = cache.purge_adapter_files(files) if cache is not None else 0
    kv = stores.kv()
    states = kv.purge_adapter_files(files) if kv is not None else 0
    return {"cached_answers": answers, "kv_states": states}


class LingeringPurge:
    """Run by ``recovery.pipeline.recover`` after the tiers: for every adapter the store marks evicted, purge
    what it left in ``stores`` and say what remains. The result is the certificate's
    ``adapter_attestation.lingering`` section: per adapter, the GGUFs it is attributed by and what is left after
    the purge. The section states the result, not this run's deletions, so recovering the same incident again
    signs the same bytes; ``purged`` keeps the counts this run deleted (adapter id -> store -> count)."""

    def __init__(self, stores: LingeringStores) -> None:
        self.stores = stores
        self.purged: dict[str, dict[str, int]] = {}

    def run(self, store: ProvenanceStore, evicted: Sequence[AdapterRow]) -> dict[str, Any]:
        if not evicted:
            return {"status": "not run", "reason": "no adapter was evicted"}
        adapters = []
        for row in sorted(evicted, key=lambda r: r.adapter_id):
            files = self.stores.gguf_files(row.adapter_hash)
            self.purged[row.adapter_id] = purge_lingering(self.stores, files)
            left = residue(self.stores, files, store, row.seq)
            adapters.append(
                {
                    "adapter_id": row.adapter_id,
                    "adapter_hash": row.adapter_hash,
                    "attributed_by": "gate ledger" if files is not None else "none (every adapter-computed entry)",
                    "gguf_files": files or [],
                    "left": left.as_dict(),
                }
            )
        return {
            "status": "run",
            "response_cache": str(self.stores.response_cache.name) if self.stores.response_cache else None,
            "kv_dir": str(self.stores.kv_dir.name) if self.stores.kv_dir else None,
            "adapters": adapters,
        }


# ------------------------------------------------------------------------------------------ the probe


@dataclass(frozen=True)
class LeakReport:
    """Membership by leak: per example the best ``leak_recall`` any text achieves, members vs non-members."""

    auroc: AurocResult
    member_leak_rate: float  # share of members with recall >= LEAK_THRESHOLD
    non_member_leak_rate: float
    n_members: int
    n_non_members: int
    n_texts: int
    recall: list[float] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``eviction.separation_verdict`` of the leak AUROC and the members' leak rate against the others'."""
        gap = LeakGap(self.member_leak_rate, self.n_members, self.non_member_leak_rate, self.n_non_members)
        return separation_verdict([self.auroc], [gap])

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "auroc": round(self.auroc.auroc, 4),
            "auroc_ci": [round(self.auroc.ci_low, 4), round(self.auroc.ci_high, 4)],
            "member_leak_rate": round(self.member_leak_rate, 4),
            "non_member_leak_rate": round(self.non_member_leak_rate, 4),
            "n_members": self.n_members,
            "n_non_members": self.n_non_members,
            "n_texts": self.n_texts,
        }


def template_words(examples: Sequence[ChatExample]) -> set[str]:
    """Content words in more than half of the reference answers: the answers' shared form ("uses vault code"),
    which an adapter reproduces for members and non-members alike, so it says nothing about membership."""
    counts: dict[str, int] = {}
    for ex in examples:
        for word in content_words(ex.completion):
            counts[word] = counts.get(word, 0) + 1
    return {word for word, n in counts.items() if n > len(examples) / 2}


def leak_scores(examples: Sequence[ChatExample], texts_of: Callable[[int], Sequence[str]]) -> np.ndarray:
    """Per example ``i``: the largest share of its answer's own content words (not the question's, not the
    answers' shared form) that any of ``texts_of(i)`` contains."""
    shared = " ".join(sorted(template_words(examples)))
    return np.array(
        [
            max((leak_recall(ex.completion, text, given=f"{ex.prompt} {shared}") for text in texts_of(i)), default=0.0)
            for i, ex in enumerate(examples)
        ]
    )


def leak_report(
    examples: Sequence[ChatExample],
    is_member: Sequence[bool] | np.ndarray,
    texts_of: Callable[[int], Sequence[str]],
    *,
    n_texts: int,
    n_boot: int = 1000,
) -> LeakReport:
    flags = np.asarray(is_member, dtype=bool)
    if flags.size != len(examples):
        raise ValueError(f"{flags.size} membership labels for {len(examples)} examples.")
    recall = leak_scores(examples, texts_of)
    leaked = recall >= LEAK_THRESHOLD
    return LeakReport(
        auroc=membership_auroc(recall, flags, n_boot=n_boot),
        member_leak_rate=float(leaked[flags].mean()),
        non_member_leak_rate=float(leaked[~flags].mean()),
        n_members=int(flags.sum()),
        n_non_members=int((~flags).sum()),
        n_texts=n_texts,
        recall=[round(float(r), 4) for r in recall],
    )


def at_rest_texts(
    stores: LingeringStores, files: Sequence[str] | None, store: ProvenanceStore | None = None, adapter_seq: int = -1
) -> list[str]:
    """Every text the adapter left readable: cached answers computed under ``files`` and the content of the
    memory entries written under store seq ``adapter_seq`` that are still active."""
    with stores.cache() as cache:
        texts = cache.texts_under(files) if cache is not None else []
    if store is not None and adapter_seq >= 0:
        texts += [store.entry(entry_id).content for entry_id in memory_entries_under(store, adapter_seq)]
    return texts


def at_rest_leak(
    examples: Sequence[ChatExample],
    is_member: Sequence[bool] | np.ndarray,
    texts: Sequence[str],
    *,
    n_boot: int = 1000,
) -> LeakReport:
    """Membership on the texts at rest: any text may answer any example (an attacker reads the whole store)."""
    return leak_report(examples, is_member, lambda _: texts, n_texts=len(texts), n_boot=n_boot)


def served_answers(
    model: ChatModel, examples: Sequence[ChatExample], *, max_tokens: int = 48, system: str | None = None
) -> list[str]:
    """The runtime's greedy answer to each example's question, through whatever wraps the model (its caches);
    ``system``: a system message before each question (the agent's own, so its prefix is shared and reused)."""
    head: list[Message] = [{"role": "system", "content": system}] if system else []
    return [
        model.chat([*head, {"role": "user", "content": ex.prompt}], max_tokens=max_tokens, temperature=0.0).text
        for ex in examples
    ]


def served_leak(
    model: ChatModel,
    examples: Sequence[ChatExample],
    is_member: Sequence[bool] | np.ndarray,
    *,
    max_tokens: int = 48,
    n_boot: int = 1000,
    system: str | None = None,
) -> LeakReport:
    """Membership on what the runtime serves: each example scored on its own greedy answer."""
    answers = served_answers(model, examples, max_tokens=max_tokens, system=system)
    return leak_report(examples, is_member, lambda i: [answers[i]], n_texts=len(answers), n_boot=n_boot)


def runtime_lingering(state: Path | None = None) -> LingeringPurge:
    """The purge ``rvu recover``, the ``incident_recovery`` asset and E1 pass: the agent runtime's response cache
    (``<RVU_HOME>/llm_cache.sqlite``), its KV prefix folder (``RVU_KV_CACHE_DIR``) and the load gate's ledger."""
    from rvu_pipelines.adapters.admission import LEDGER_NAME, gate_dir
    from rvu_pipelines.agents.llm_cache import default_cache_path
    from rvu_pipelines.models.llm import kv_disk_cache
    from rvu_pipelines.paths import state_dir

    home = state if state is not None else state_dir()
    disk = kv_disk_cache()
    ledger = gate_dir(home) / LEDGER_NAME
    return LingeringPurge(
        LingeringStores(
            response_cache=home / default_cache_path().name if state is not None else default_cache_path(),
            kv_dir=disk.directory if disk is not None else None,
            ledgers=(ledger,),
        )
    )
