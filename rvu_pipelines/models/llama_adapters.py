"""LoRA adapters loaded into and unloaded from an open ``llama_cpp.Llama`` while the agent runs.

The agent's model stays loaded (Q4_1 weights untouched); an adapter is a GGUF LoRA file
(``adapters.gguf_lora``) that llama.cpp keeps beside the weights and adds in the graph
(``W x + scale * alpha / rank * B (A x)``). llama.cpp's API (llama.h, bound in llama_cpp.llama_cpp):
``llama_adapter_lora_init(model, path)`` reads a file (NULL when refused), ``llama_set_adapters_lora(ctx,
adapters, n, scales)`` replaces the context's whole adapter set (a scale of 0 leaves one out of the graph),
``llama_adapter_lora_free`` releases one; adapters still alive when the model is freed go with it, so
they are freed here first (on unload, on ``close`` and, through the Llama's own exit stack, just before
the Llama frees its context and model).

What the KV cache holds was computed under the adapter set of the moment; after a change nothing may be
reused: the live context (``Llama.reset`` + KV memory cleared), the project's ``KVPrefixStore``
snapshots (``Llama.prefix_store``, models.llm) and a llama-cpp-python ``Llama.cache`` are all dropped
here, and ``on_change`` tells the owner (completion caches keyed by ``adapter_key()``). The caller
serialises calls with generation (LlamaCppChatModel holds a lock around every llama.cpp call).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rvu_pipelines.hashing import sha256_file


class AdapterAdmissions(Protocol):
    """What decides whether a GGUF may be loaded (``adapters.admission.LoadGate``): raises to refuse."""

    def require_admitted(self, adapter_id: str, gguf_path: Path, gguf_sha256: str) -> None: ...


class AdapterLoadError(RuntimeError):
    """llama.cpp (or the metadata check before it) refused an adapter file; ``path`` names the file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"LoRA adapter {path} was not loaded: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class LoadedAdapter:
    adapter_id: str
    path: Path
    sha256: str
    scale: float


@dataclass
class _Slot:
    info: LoadedAdapter
    handle: Any  # llama_adapter_lora_p (a c_void_p value)


def model_architecture(llama: Any) -> str:
    """``general.architecture`` of the model the Llama has open ("llama" for SmolLM2)."""
    import llama_cpp

    buffer = ctypes.create_string_buffer(256)
    n = int(llama_cpp.llama_model_meta_val_str(llama._model.model, b"general.architecture", buffer, len(buffer)))
    return buffer.value.decode("utf-8", "replace") if n >= 0 else ""


def check_adapter_file(path: Path, architecture: str) -> None:
    """The metadata llama.cpp checks, read first so a refusal says which key is wrong (llama.cpp's own
    reason only reaches its log, which ``verbose=False`` silences). The file is untrusted: it is read by the
    bounded header reader (``models.gguf_header``), so a truncated, hostile or deeply nested header is a refusal,
    never a crash."""
    import gguf

    from rvu_pipelines.models.gguf_header import read_header

    if not path.is_file():
        raise AdapterLoadError(path, "no such file.")
    try:
        header = read_header(path)
    except (ValueError, OSError) as exc:
        raise AdapterLoadError(path, f"not a readable GGUF file ({exc}).") from exc
    expected = {
        gguf.Keys.General.TYPE: gguf.GGUFType.ADAPTER,
        gguf.Keys.Adapter.TYPE: "lora",
        gguf.Keys.General.ARCHITECTURE: architecture,
    }
    for key, want in expected.items():
        got = header.metadata.get(key)
        if got != want:
            raise AdapterLoadError(path, f"metadata {key} is {got!r}, the base model needs {want!r}.")
    if not any(name.endswith(".lora_a") for name in header.tensor_shapes):
        raise AdapterLoadError(path, "the file holds no .lora_a/.lora_b tensors.")


class LlamaAdapterSlots:
    """The LoRA adapters active on one ``llama_cpp.Llama``, by id, each with its scale.

    ``load`` / ``unload`` / ``clear`` change the set llama.cpp applies and reset every cache that holds
    state computed under the previous set; ``adapter_key()`` is what a completion cache must add to its
    key. ``on_change(loaded)`` is called after each change with the adapters now loaded.
    """

    def __init__(
        self,
        llama: Any,
        *,
        admissions: AdapterAdmissions | None,
        on_change: Callable[[tuple[LoadedAdapter, ...]], None] | None = None,
    ) -> None:
        if getattr(llama, "lora_path", None):
            raise ValueError(
                "This Llama was opened with lora_path; llama_set_adapters_lora replaces the whole set and "
                "would silently drop that adapter. Open the model without it and load it here."
            )
        self._llama = llama
        self.admissions = admissions
        self._on_change = on_change
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._architecture = model_architecture(llama)
        stack = getattr(llama, "_stack", None)
        if stack is not None:  # LIFO: runs before the Llama frees its context and model
            stack.callback(self.close)

    # queries

    def active(self) -> list[tuple[str, float]]:
        """(adapter id, scale) in load order."""
        with self._lock:
            return [(s.info.adapter_id, s.info.scale) for s in self._slots.values()]

    def loaded(self) -> tuple[LoadedAdapter, ...]:
        with self._lock:
            return tuple(s.info for s in self._slots.values())

    def adapter_key(self) -> str:
        """What a completion cache adds to its key: "" when the base model alone runs, else the sha256 of
        the sorted (file sha256, scale) pairs. The file's bytes and the scale change the output, the id
        does not; a scale of 0 is left out of the graph by llama.cpp and so out of the key."""
        with self._lock:
            lines = sorted(f"{s.info.sha256}\t{s.info.scale!r}" for s in self._slots.values() if s.info.scale != 0.0)
            return hashlib.sha256("\n".join(lines).encode()).hexdigest() if lines else ""

    def adapter_files(self) -> list[str]:
        """The sha256 of each GGUF that shapes the output now (scale 0 is left out, as in the key): what a cache
        records beside an answer, so evicting an adapter finds every answer and KV state computed under it."""
        with self._lock:
            return sorted({s.info.sha256 for s in self._slots.values() if s.info.scale != 0.0})

    # changes

    def load(self, adapter_id: str, gguf_path: Path | str, scale: float = 1.0) -> LoadedAdapter:
        """Read ``gguf_path`` into llama.cpp and add it to the active set with ``scale``, once the adapter gate
        (``admissions``) has admitted that very file; with no gate attached nothing loads."""
        import llama_cpp

        path = Path(gguf_path)
        if not math.isfinite(scale):
            raise ValueError(f"Adapter {adapter_id!r}: scale must be finite, got {scale}.")
        with self._lock:
            self._check_open()
            if adapter_id in self._slots:
                raise ValueError(f"Adapter id {adapter_id!r} is already loaded; unload it first.")
            if self.admissions is None:
                raise AdapterLoadError(
                    path,
                    "no adapter gate is attached to this model; every load is screened first "
                    "(LlamaCppChatModel(adapter_gate=...) with an adapters.admission.LoadGate).",
                )
            check_adapter_file(path, self._architecture)
            info = LoadedAdapter(adapter_id, path, sha256_file(path), float(scale))
            self.admissions.require_admitted(adapter_id, path, info.sha256)
            handle = llama_cpp.llama_adapter_lora_init(self._llama._model.model, str(path).encode("utf-8"))
            if not handle:
                raise AdapterLoadError(
                    path,
                    "llama.cpp refused it (tensor names or shapes do not match the base model, or a tensor "
                    "pair is incomplete; open the Llama with verbose=True for llama.cpp's reason).",
                )
            slot = _Slot(info, handle)
            try:
                self._apply([*self._slots.values(), slot])
            except AdapterLoadError:
                llama_cpp.llama_adapter_lora_free(handle)
                self._apply(list(self._slots.values()))
                raise
            self._slots[adapter_id] = slot
            self._changed()
            return info

    def unload(self, adapter_id: str) -> None:
        """Take ``adapter_id`` out of the active set and free its native memory."""
        import llama_cpp

        with self._lock:
            self._check_open()
            if adapter_id not in self._slots:
                raise KeyError(f"No adapter {adapter_id!r} is loaded (loaded: {sorted(self._slots) or 'none'}).")
            remaining = [s for k, s in self._slots.items() if k != adapter_id]
            self._apply(remaining)
            slot = self._slots.pop(adapter_id)
            llama_cpp.llama_adapter_lora_free(slot.handle)
            self._changed()

    def clear(self) -> None:
        """Unload every adapter: the base model alone again."""
        with self._lock:
            self._check_open()
            if not self._slots:
                return
            self._apply([])
            self._free_all()
            self._changed()

    def close(self) -> None:
        """Detach and free every native adapter; idempotent (also run by the Llama's own ``close``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._slots:
                ctx = getattr(getattr(self._llama, "_ctx", None), "ctx", None)
                if ctx is not None:
                    self._apply([])
                self._free_all()

    # internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("LlamaAdapterSlots is closed (its Llama was closed).")

    def _apply(self, slots: list[_Slot]) -> None:
        import llama_cpp

        n = len(slots)
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*[s.handle for s in slots]) if n else None
        scales = (ctypes.c_float * n)(*[s.info.scale for s in slots]) if n else None
        rc = int(llama_cpp.llama_set_adapters_lora(self._llama._ctx.ctx, adapters, n, scales))
        if rc != 0:
            path = slots[-1].info.path if slots else Path("<none>")
            raise AdapterLoadError(path, f"llama_set_adapters_lora returned {rc}.")

    def _free_all(self) -> None:
        import llama_cpp

        for slot in self._slots.values():
            llama_cpp.llama_adapter_lora_free(slot.handle)
        self._slots.clear()

    def _changed(self) -> None:
        """Forget every state computed under the previous adapter set, then tell the owner."""
        invalidate_llama_caches(self._llama)
        if self._on_change is not None:
            self._on_change(tuple(s.info for s in self._slots.values()))


def invalidate_llama_caches(llama: Any) -> None:
    """The live KV context, the ``KVPrefixStore`` snapshots (models.llm) and a llama-cpp-python cache."""
    llama.reset()  # n_tokens = 0: generate() re-evaluates the whole prompt
    ctx = getattr(llama, "_ctx", None)
    if ctx is not None:
        ctx.kv_cache_clear()
    store = getattr(llama, "prefix_store", None)
    if store is not None:
        store.clear()
    cache = getattr(llama, "cache", None)
    if cache is not None:
        if hasattr(cache, "cache_state"):  # LlamaRAMCache
            cache.cache_state.clear()
        elif hasattr(getattr(cache, "cache", None), "clear"):  # LlamaDiskCache (diskcache.Cache)
            cache.cache.clear()
        else:
            llama.set_cache(None)
