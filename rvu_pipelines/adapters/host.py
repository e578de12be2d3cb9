"""A transformers + peft model that loads, unloads and fuses verified adapters, and says so.

The study side of the runtime (the agent's llama.cpp side is ``models.llama_adapters``): one base model,
at most one active adapter (the incident log's ``active_adapter_id`` is singular), every lifecycle change
an ``AdapterEvent`` handed to ``on_event`` — the same fields an incident log's ``adapter_loaded /
adapter_unloaded / adapter_fused`` lines carry, so RVU v2's closure can follow what the model ran under.

Only ``VerifiedAdapter``s (``adapters.files.verify_adapter``) are accepted, and each load is first judged by
the host's gate (``adapters.admission.LoadGate``): nothing reaches peft without the file checks and a
recorded verdict. The studies that must load harmful adapters to measure them pass an audit gate
(``enforce=False``), which records its refusals and raises none. Unloading removes the LoRA layers and
leaves the base weights as they were, bit for bit; a fused adapter is merged into the weights and unloading
it subtracts it again (exact up to float32 rounding).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from rvu_pipelines.adapters.admission import GateVerdict, LoadGate
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.training import LoraSettings, peft_config

EventKind = Literal["adapter_loaded", "adapter_unloaded", "adapter_fused"]


@dataclass(frozen=True)
class AdapterEvent:
    kind: EventKind
    adapter_id: str
    adapter_hash: str
    source: str
    at: float

    def lifecycle_fields(self) -> dict[str, Any]:
        """The fields of an incident-log lifecycle line (the log writer adds entry id, episode and timestamp)."""
        from rvu_pipelines.adapters.runtime import lifecycle_fields

        return lifecycle_fields(self.kind, self.adapter_id, sha256=self.adapter_hash, source=self.source)


def settings_of(adapter: VerifiedAdapter) -> LoraSettings:
    manifest = adapter.manifest
    return LoraSettings(
        rank=manifest.rank,
        alpha=manifest.alpha,
        target_modules=tuple(manifest.target_modules),
        layers=tuple(manifest.layers) if manifest.layers is not None else None,
        seed=manifest.seed,
    )


class AdapterHost:
    """``model`` is the module to run: the base, or the base with the active adapter."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        gate: LoadGate,
        on_event: Callable[[AdapterEvent], None] | None = None,
    ) -> None:
        self.base = model
        self.gate = gate
        self.verdicts: list[GateVerdict] = []
        self.tokenizer = tokenizer
        self._wrapped: Any = None
        self._active: VerifiedAdapter | None = None
        self._fused = False
        self._on_event = on_event
        self.events: list[AdapterEvent] = []

    @property
    def model(self) -> Any:
        return self._wrapped if self._wrapped is not None else self.base

    @property
    def active(self) -> VerifiedAdapter | None:
        return self._active

    @property
    def fused(self) -> bool:
        return self._fused

    def _emit(self, kind: EventKind, adapter: VerifiedAdapter) -> None:
        event = AdapterEvent(kind, adapter.adapter_id, adapter.sha256, adapter.manifest.source, time.time())
        self.events.append(event)
        if self._on_event is not None:
            self._on_event(event)

    def load(self, adapter: VerifiedAdapter) -> None:
        """Activate ``adapter`` once the gate admits it (``AdapterRefused`` from an enforcing gate otherwise);
        an active one is unloaded first, with its own event."""
        from peft import get_peft_model, set_peft_model_state_dict

        self.verdicts.append(self.gate.check(adapter))
        if self._active is not None:
            self.unload()
        wrapped = get_peft_model(self.base, peft_config(settings_of(adapter)))
        result = set_peft_model_state_dict(wrapped, adapter.tensors)
        unplaced = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unplaced:
            wrapped.unload()
            raise ValueError(f"{adapter.folder}: peft did not place tensors {unplaced[:3]}")
        wrapped.eval()
        self._wrapped, self._active = wrapped, adapter
        self._emit("adapter_loaded", adapter)

    def fuse(self) -> None:
        """Merge the active adapter into the base weights (faster inference; still evictable)."""
        if self._active is None or self._wrapped is None:
            raise RuntimeError("No adapter is loaded, so there is nothing to fuse.")
        if not self._fused:
            self._wrapped.merge_adapter()
            self._fused = True
            self._emit("adapter_fused", self._active)

    def unload(self) -> None:
        """Remove the active adapter (un-merging it first if fused); the base model is what remains."""
        if self._active is None or self._wrapped is None:
            return
        adapter = self._active
        if self._fused:
            self._wrapped.unmerge_adapter()
            self._fused = False
        self.base = self._wrapped.unload()
        self._wrapped, self._active = None, None
        self._emit("adapter_unloaded", adapter)

    @contextmanager
    def loaded(self, adapter: VerifiedAdapter) -> Iterator[Any]:
        """``with host.loaded(a) as model:`` — the adapter for the block, the base again after it."""
        self.load(adapter)
        try:
            yield self.model
        finally:
            self.unload()
