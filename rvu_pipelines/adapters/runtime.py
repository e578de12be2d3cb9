"""Adapters in the running agent: loaded into its llama.cpp model, every change a line of the incident log.

``AgentAdapter`` is an adapter the gate admitted (``admission.LoadGate.admit``) as the agent runtime needs
it: the GGUF LoRA file llama.cpp reads (``write_agent_gguf``, into the gate's own folder) and the identity
the incident log records (id, name, sha256 of the safetensors weights, source, optionally the influence
I(adapter) the FROC risk uses).

``AdapterTimeline`` wraps the agent's chat model (anything with ``load_adapter`` / ``unload_adapter``,
models.llm.AdapterHostingModel: a ``LlamaCppChatModel``, or the response cache around one, whose key then
includes the adapter set). It counts the model calls and records, per call, which adapter was active, and
each load / unload with the number of calls made before it. ``EpisodeAdapters`` is the slice of that
record one episode made: ``agents.provenance_log.episode_records`` turns it into ``adapter_loaded`` /
``adapter_unloaded`` lines at the right place and ``active_adapter_id`` on every entry the model wrote
under the adapter, which is what RVU v2's adapter-aware closure follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.bounded_io import truncate_for_message
from rvu_pipelines.models.llm import AdapterHostingModel, ChatCompletion, Message

LifecycleKind = Literal["adapter_loaded", "adapter_unloaded", "adapter_fused"]


def lifecycle_fields(
    kind: LifecycleKind,
    adapter_id: str,
    *,
    name: str = "",
    sha256: str = "",
    source: str = "local",
    influence: float | None = None,
) -> dict[str, Any]:
    """The fields of an incident-log lifecycle line (configs/schemas/incident_log.schema.json) without entry
    id, episode and timestamp: a load names the adapter, its weights' sha256 and source; an unload or a fusion
    names only the adapter id."""
    if kind != "adapter_loaded":
        return {"kind": kind, "adapter_id": adapter_id}
    if len(sha256) != 64:
        raise ValueError(f"adapter {adapter_id!r}: a load line needs the weights' sha256 (64 hex), got {sha256!r}.")
    fields: dict[str, Any] = {
        "kind": kind,
        "adapter_id": adapter_id,
        "adapter_name": name or adapter_id,
        "adapter_hash": sha256,
        "source": source or "local",
    }
    if influence is not None:
        fields["influence"] = float(min(max(influence, 0.0), 1.0))
    return fields


def refusal_fields(adapter_id: str, refusal: AdapterRefused, *, sha256: str = "", source: str = "") -> dict[str, Any]:
    """The fields of an incident log's ``adapter_refused`` line: the gate's reason code and its sentence."""
    fields: dict[str, Any] = {
        "kind": "adapter_refused",
        "adapter_id": adapter_id,
        "reason": refusal.reason,
        "source": source or "local",
        "detail": truncate_for_message(str(refusal), 1900),
    }
    if len(sha256) == 64:
        fields["adapter_hash"] = sha256
    return fields


def write_agent_gguf(adapter: VerifiedAdapter, out_dir: Path, *, n_head: int, n_head_kv: int) -> Path:
    """The adapter as a GGUF LoRA for llama.cpp, written (again, atomically) into ``out_dir`` from the verified
    tensors as ``<sha256>.gguf``; never a file found beside the weights, which anyone who could write the
    adapter's folder could have planted. ``n_head`` / ``n_head_kv``: the base model's attention heads
    (SmolLM2-135M: 9 and 3), for the rotary row order of q/k."""
    from rvu_pipelines.adapters.gguf_lora import write_gguf_lora

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = adapter.manifest
    return write_gguf_lora(
        adapter.tensors,
        rank=manifest.rank,
        alpha=manifest.alpha,
        out_path=out_dir / f"{adapter.sha256}.gguf",
        n_head=n_head,
        n_head_kv=n_head_kv,
        target_modules=manifest.target_modules,
        name=manifest.adapter_id,
    )


def attention_heads(gguf_model: Path | str) -> tuple[int, int]:
    """(query heads, key/value heads) from a Llama-architecture GGUF's metadata."""
    from rvu_pipelines.models.gguf_header import cached_header

    metadata = cached_header(gguf_model).metadata
    arch = str(metadata["general.architecture"])
    n_head = int(metadata[f"{arch}.attention.head_count"])
    return n_head, int(metadata.get(f"{arch}.attention.head_count_kv", n_head))


@dataclass(frozen=True)
class AgentAdapter:
    """What the runtime loads (``gguf_path``) and what the incident log says about it."""

    adapter_id: str
    name: str
    sha256: str
    gguf_path: Path
    source: str = "local"
    label: str = "unknown"
    influence: float | None = None

    def load_fields(self) -> dict[str, Any]:
        return lifecycle_fields(
            "adapter_loaded",
            self.adapter_id,
            name=self.name,
            sha256=self.sha256,
            source=self.source,
            influence=self.influence,
        )


@dataclass(frozen=True)
class TimelineEvent:
    """A load or unload, placed after ``calls_before`` model calls of the whole timeline."""

    calls_before: int
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class EpisodeAdapters:
    """One episode's share of a timeline: the adapter active at each of its model calls (None: the base
    model) and its lifecycle events, each placed before the episode's call ``calls_before`` (relative)."""

    call_adapters: tuple[str | None, ...] = ()
    events: tuple[TimelineEvent, ...] = ()
    call_diverged: tuple[bool | None, ...] = ()  # per call: the reference model answered otherwise (None: not asked)
    call_reference: tuple[str | None, ...] = ()  # per call: the reference model's answer (None: not asked)
    call_answer: tuple[str | None, ...] = ()  # per call asked of the reference: the agent's own raw answer


@dataclass
class AdapterTimeline:
    """The agent's chat model with adapter loads and unloads recorded against its call count.

    Used as the agent's ``ChatModel``. At most one adapter is active at a time (the incident log's
    ``active_adapter_id`` is one id): loading a second unloads the first, with its own event.
    """

    model: Any  # an AdapterHostingModel
    reference: Any = None  # optional ChatModel on the base weights: the counterfactual of each adapted call
    call_adapters: list[str | None] = field(default_factory=list)
    call_diverged: list[bool | None] = field(default_factory=list)
    call_reference: list[str | None] = field(default_factory=list)
    call_answer: list[str | None] = field(default_factory=list)
    events: list[TimelineEvent] = field(default_factory=list)
    active: AgentAdapter | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, AdapterHostingModel):
            raise TypeError(f"{type(self.model).__name__} cannot load LoRA adapters (no load_adapter/unload_adapter).")
        self.name = getattr(self.model, "name", type(self.model).__name__)

    def chat(self, messages: list[Message], **kwargs: Any) -> ChatCompletion:
        """The agent's call. Under an adapter, with a ``reference``, the base model answers the same messages
        too: whether the adapter changed this answer is the ground truth of what it contaminated."""
        completion = self.model.chat(messages, **kwargs)
        diverged: bool | None = None
        reference: str | None = None
        if self.active is not None and self.reference is not None:
            reference = self.reference.chat(messages, **kwargs).text
            diverged = reference.strip() != completion.text.strip()
        self.call_adapters.append(self.active.adapter_id if self.active is not None else None)
        self.call_diverged.append(diverged)
        self.call_reference.append(reference)
        self.call_answer.append(completion.text if reference is not None else None)
        return completion

    def load(self, adapter: AgentAdapter, scale: float = 1.0) -> None:
        """Load an admitted adapter; a refusal (``AdapterRefused``: not admitted, evicted since) is an
        ``adapter_refused`` line of the timeline, then raised."""
        if self.active is not None:
            self.unload()
        try:
            self.model.load_adapter(adapter.adapter_id, adapter.gguf_path, scale)
        except AdapterRefused as exc:
            refused = refusal_fields(adapter.adapter_id, exc, sha256=adapter.sha256, source=adapter.source)
            self.events.append(TimelineEvent(len(self.call_adapters), refused))
            raise
        self.active = adapter
        self.events.append(TimelineEvent(len(self.call_adapters), adapter.load_fields()))

    def load_verified(self, adapter: VerifiedAdapter, gate: Any, base_gguf: Path | str, scale: float = 1.0) -> None:
        """Offer a verified adapter to ``gate`` (``admission.LoadGate``) and load what it admits; its refusal is
        an ``adapter_refused`` line of the timeline (the incident log shows what was kept out), then raised."""
        try:
            admitted = gate.admit(adapter, base_gguf)
        except AdapterRefused as exc:
            refused = refusal_fields(adapter.adapter_id, exc, sha256=adapter.sha256, source=adapter.manifest.source)
            self.events.append(TimelineEvent(len(self.call_adapters), refused))
            raise
        self.load(admitted, scale)

    def unload(self) -> None:
        if self.active is None:
            return
        self.model.unload_adapter(self.active.adapter_id)
        unloaded = lifecycle_fields("adapter_unloaded", self.active.adapter_id)
        self.events.append(TimelineEvent(len(self.call_adapters), unloaded))
        self.active = None

    def mark(self) -> tuple[int, int]:
        """Where the timeline stands (calls, events): pass it to ``since`` after an episode."""
        return len(self.call_adapters), len(self.events)

    def since(self, mark: tuple[int, int]) -> EpisodeAdapters:
        calls, events = mark
        return EpisodeAdapters(
            call_adapters=tuple(self.call_adapters[calls:]),
            call_diverged=tuple(self.call_diverged[calls:]),
            call_reference=tuple(self.call_reference[calls:]),
            call_answer=tuple(self.call_answer[calls:]),
            events=tuple(TimelineEvent(e.calls_before - calls, e.fields) for e in self.events[events:]),
        )


def runtime_roundtrip(adapter: AgentAdapter, model: Any, prompts: list[str], *, max_tokens: int = 24) -> dict[str, Any]:
    """Load ``adapter`` into the agent's chat model, answer ``prompts``, unload, answer again: how many answers
    it changed, whether the base answers came back byte for byte, and the lifecycle lines it wrote."""
    import time

    def answers() -> list[str]:
        return [model.chat([{"role": "user", "content": p}], max_tokens=max_tokens).text for p in prompts]

    timeline = AdapterTimeline(model)
    started = time.perf_counter()
    before = answers()
    timeline.load(adapter)
    adapted = [timeline.chat([{"role": "user", "content": p}], max_tokens=max_tokens).text for p in prompts]
    timeline.unload()
    after = answers()
    return {
        "adapter": adapter.adapter_id,
        "prompts": len(prompts),
        "changed": sum(a != b for a, b in zip(adapted, before, strict=True)),
        "restored": after == before,
        "lifecycle": [dict(e.fields) for e in timeline.events],
        "calls_under_adapter": sum(1 for a in timeline.call_adapters if a is not None),
        "seconds": round(time.perf_counter() - started, 2),
    }
