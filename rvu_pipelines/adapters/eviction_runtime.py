"""The eviction test that can fail: a memorising adapter on the agent's own runtime, every place it lingers.

E6 (``eviction.membership_before_after``) compares the adapter loaded with the base after a peft unload, which
is the base bit for bit, so "clean after eviction" holds by construction there. Here the same members and
non-members meet the runtime the agent uses — llama.cpp on the quantised GGUF, behind the response cache and
the KV prefix folder — and each way an eviction can be incomplete has its own row and its own control:

- ``served``: greedy answers of the runtime (through its caches) on the base, with the adapter loaded, and after
  it is unloaded; leak AUROC members vs non-members (``lingering.served_leak``);
- ``at_rest``: the texts it left readable — cached answers attributed to its GGUF — before and after the purge
  (``lingering.at_rest_leak``), with the counts of what was left;
- ``fused`` (peft host, when given): merged into the weights then un-merged, likelihood AUROCs against the base;
  ``not_unmerged`` is the same merged weights with the un-merge skipped, the control that must read ``residual``.

A row that reads ``clean`` where its control reads ``residual`` is evidence the eviction removed that path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.eviction import membership_before_after, verdict
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.host import AdapterHost, settings_of
from rvu_pipelines.adapters.lingering import (
    LingeringStores,
    at_rest_leak,
    at_rest_texts,
    purge_lingering,
    residue,
    served_leak,
)
from rvu_pipelines.adapters.membership import MembershipReport, membership_report
from rvu_pipelines.adapters.training import peft_config
from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
from rvu_pipelines.models.llm import ChatModel


def _likelihood(report: MembershipReport) -> dict[str, Any]:
    return {"verdict": verdict(report), "auroc": {name: round(r.auroc, 4) for name, r in report.auroc.items()}}


def not_unmerged(
    host: AdapterHost, adapter: VerifiedAdapter, examples: Sequence[ChatExample], flags: np.ndarray
) -> MembershipReport:
    """Membership on the weights a fused adapter leaves when its LoRA layers go without the un-merge (the control
    of the fused row). The weights are restored afterwards: the un-merge runs once the scores are taken."""
    from peft import get_peft_model, set_peft_model_state_dict

    wrapped = get_peft_model(host.base, peft_config(settings_of(adapter)))
    set_peft_model_state_dict(wrapped, adapter.tensors)
    wrapped.merge_adapter()  # merged: the forward runs the base layers alone, which now carry the adapter
    try:
        return membership_report(wrapped, host.tokenizer, examples, flags, probes=False, n_boot=200)
    finally:
        wrapped.unmerge_adapter()
        host.base = wrapped.unload()


def runtime_eviction(
    runtime: ChatModel,
    model_sha256: str,
    adapter: VerifiedAdapter,
    gguf_path: Path,
    stores: LingeringStores,
    examples: Sequence[ChatExample],
    is_member: Sequence[bool] | np.ndarray,
    *,
    host: AdapterHost | None = None,
    max_tokens: int = 48,
    n_boot: int = 1000,
    system: str | None = None,
) -> dict[str, Any]:
    """Every row of the study (module docstring) for ``adapter``, whose GGUF the gate admitted at ``gguf_path``,
    on ``runtime`` (an adapter-hosting llama.cpp model whose KV folder is ``stores.kv_dir``); the response cache is
    ``stores.response_cache``. ``system``: the system message the runtime serves under (a long shared one writes
    KV prefix states to disk). Purges what the adapter left as part of the run."""
    if stores.response_cache is None:
        raise ValueError("runtime_eviction needs a response cache path in stores (the agent's cache)")
    flags = np.asarray(is_member, dtype=bool)
    served = CachedChatModel(runtime, ResponseCache(stores.response_cache), model_sha256)

    def leak(model: ChatModel) -> dict[str, Any]:
        return served_leak(model, examples, flags, max_tokens=max_tokens, n_boot=n_boot, system=system).to_dict()

    rows: dict[str, Any] = {"served": {"base": leak(served)}}
    served.load_adapter(adapter.adapter_id, gguf_path)
    try:
        rows["served"]["loaded"] = leak(served)
    finally:
        served.unload_adapter(adapter.adapter_id)
    rows["served"]["evicted"] = leak(served)

    files = stores.gguf_files(adapter.sha256)
    rows["at_rest"] = {
        "gguf_files": files or [],
        "before_purge": {
            **at_rest_leak(examples, flags, at_rest_texts(stores, files), n_boot=n_boot).to_dict(),
            "left": residue(stores, files).as_dict(),
        },
        "purged": purge_lingering(stores, files),
        "after_purge": {
            **at_rest_leak(examples, flags, at_rest_texts(stores, files), n_boot=n_boot).to_dict(),
            "left": residue(stores, files).as_dict(),
        },
    }
    if host is not None:
        fused = membership_before_after(host, adapter, examples, flags, probes=False, n_boot=n_boot, fused=True)
        rows["fused"] = {
            "base": _likelihood(fused.base),
            "loaded": _likelihood(fused.loaded),
            "unmerged": _likelihood(fused.evicted),
            "not_unmerged": _likelihood(not_unmerged(host, adapter, examples, flags)),
        }
    rows["n"] = {"members": int(flags.sum()), "non_members": int((~flags).sum())}
    return rows
