"""Chat models behind one interface: llama.cpp in-process (default) or an OpenAI-compatible server.

Both are deterministic by default (temperature 0, fixed seed) and report how long the prompt and
the generation took, so throughput is measured the same way whichever backend runs.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.models.llama_runtime import LlamaRuntimeSettings, open_llama

Message = dict[str, str]


@dataclass(frozen=True)
class ChatCompletion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    prompt_seconds: float
    generation_seconds: float
    finish_reason: str

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tokens_per_s(self) -> float:
        return self.completion_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0


class ChatModel(Protocol):
    name: str

    def chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int = 0,
        stop: list[str] | None = None,
    ) -> ChatCompletion: ...


@runtime_checkable
class AdapterHostingModel(Protocol):
    """A chat model that loads LoRA adapters at run time (``LlamaCppChatModel``; the cache and lazy wrappers
    pass the calls through). ``adapter_key()`` is "" while the base model alone runs."""

    def load_adapter(self, adapter_id: str, gguf_path: Path | str, scale: float = 1.0) -> Any: ...

    def unload_adapter(self, adapter_id: str) -> None: ...

    def adapter_key(self) -> str: ...

    def active_adapters(self) -> list[str]: ...


def adapter_key_of(model: object) -> str:
    """The adapter part of a completion-cache key: "" for a model that cannot host adapters."""
    return str(model.adapter_key()) if isinstance(model, AdapterHostingModel) else ""


PrefixReuse = Literal["off", "last", "ram"]
PREFIX_REUSE_MODES: tuple[str, ...] = ("off", "last", "ram")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common token prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):  # stops at the shorter sequence on purpose
        if x != y:
            break
        n += 1
    return n


@dataclass
class _KVSnapshot:
    tokens: tuple[int, ...]
    state: bytes


class KVPrefixStore:
    """Snapshots of the KV cache (sequence 0 only, no logits) keyed by the tokens they hold, LRU by bytes.

    llama-cpp-python reuses only the prefix shared with the *previous* call. When calls with different
    prefixes interleave (an agent and a defense's own LLM calls, several defenses), each switch would
    re-evaluate the whole system prompt + tool schema. Before a call discards ``min_tokens`` or more of
    the live context, the live context is saved here; a later call whose prompt shares a longer prefix
    with a snapshot than with the live context restores it first. The restored KV values are the bytes
    computed before, as in llama-cpp-python's own reuse of the last prefix; tests and the benchmark check
    the text equals a cold run's. ``Llama.set_cache(LlamaRAMCache)`` does the same but saves the full
    state and a (n_batch x n_vocab) float array after every call (~0.5 s per call on 2 cores).
    """

    def __init__(self, capacity_bytes: int = 512 << 20, min_tokens: int = 64) -> None:
        self.capacity_bytes = int(capacity_bytes)
        self.min_tokens = int(min_tokens)
        self._snapshots: OrderedDict[tuple[int, ...], _KVSnapshot] = OrderedDict()
        self.saves = 0
        self.restores = 0

    def __len__(self) -> int:
        return len(self._snapshots)

    @property
    def size_bytes(self) -> int:
        return sum(len(s.state) for s in self._snapshots.values())

    def clear(self) -> None:
        self._snapshots.clear()

    def prepare(self, llm: Any, tokens: Sequence[int]) -> None:
        """Called before ``llm.generate(tokens)``: save what it would discard, restore a better prefix."""
        current = llm.input_ids[: llm.n_tokens].tolist()
        live = _common_prefix(current, tokens)
        if len(current) - live >= self.min_tokens:
            self._save(llm, tuple(current))
        best, best_len = None, live
        for snapshot in self._snapshots.values():
            shared = _common_prefix(snapshot.tokens, tokens)
            if shared > best_len:
                best, best_len = snapshot, shared
        if best is not None and best_len - live >= self.min_tokens:
            self._restore(llm, best)

    def _save(self, llm: Any, tokens: tuple[int, ...]) -> None:
        import ctypes

        import llama_cpp

        ctx = llm._ctx.ctx
        size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
        if size <= 0 or size > self.capacity_bytes:
            return
        buffer = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0))
        if written <= 0:
            return
        # a snapshot whose tokens are a prefix of this one is superseded by it
        for key in [k for k in self._snapshots if len(k) <= len(tokens) and tokens[: len(k)] == k]:
            del self._snapshots[key]
        self._snapshots[tokens] = _KVSnapshot(tokens, ctypes.string_at(buffer, written))
        self.saves += 1
        while self.size_bytes > self.capacity_bytes and self._snapshots:
            self._snapshots.popitem(last=False)

    def _restore(self, llm: Any, snapshot: _KVSnapshot) -> None:
        import ctypes

        import llama_cpp

        buffer = (ctypes.c_uint8 * len(snapshot.state)).from_buffer_copy(snapshot.state)
        if int(llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, buffer, len(snapshot.state), 0)) != len(snapshot.state):
            llm.reset()  # a failed restore leaves nothing reusable: evaluate the prompt from scratch
            del self._snapshots[snapshot.tokens]
            return
        n = len(snapshot.tokens)
        llm.input_ids[:n] = snapshot.tokens
        llm.n_tokens = n
        llm._requires_eval = True  # logits are not restored: generate() re-decodes at least one token
        self._snapshots.move_to_end(snapshot.tokens)
        self.restores += 1


_PREFIX_LLAMA: type | None = None


def _prefix_llama_class() -> type:
    """``Llama`` whose ``generate`` first consults a ``KVPrefixStore`` (built lazily: llama_cpp is heavy)."""
    global _PREFIX_LLAMA
    if _PREFIX_LLAMA is None:
        from llama_cpp import Llama

        class _PrefixReusingLlama(Llama):  # type: ignore[misc]
            prefix_store: KVPrefixStore | None = None

            def generate(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
                if self.prefix_store is not None and kwargs.get("reset", True):
                    self.prefix_store.prepare(self, tokens)
                return super().generate(tokens, *args, **kwargs)

        _PREFIX_LLAMA = _PrefixReusingLlama
    return _PREFIX_LLAMA


class LlamaCppChatModel:
    """A GGUF model run in-process by llama-cpp-python.

    ``prefix_reuse`` says how the KV state of a shared prompt prefix is reused across calls:
    "off" resets the context before every call (the cold baseline), "last" is llama-cpp-python's own
    reuse of the prefix shared with the previous call, "ram" adds a ``KVPrefixStore`` so interleaved
    prefixes (several defenses, an agent and a judge) are each evaluated once. Text is the same in
    every mode at temperature 0 (KV values are reused as computed; checked by the tests). The default
    "ram" was picked by benchmarks/bench_agent_speed.py: same as "last" on one prefix, several times
    faster when prefixes interleave. ``prefix_cache_bytes`` bounds its snapshots (~23 KB per token for
    SmolLM2-135M; least recently used first out). ``runtime`` holds the llama.cpp model parameters the
    project sets (default from the environment: no extra buffer types, see ``llama_runtime``); the
    first load of a model on a machine is tried in a child process first (``native_probe``).
    """

    def __init__(
        self,
        model_path: Path,
        *,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 0,
        name: str | None = None,
        prefix_reuse: PrefixReuse = "ram",
        prefix_cache_bytes: int = 512 << 20,
        runtime: LlamaRuntimeSettings | None = None,
    ) -> None:
        if prefix_reuse not in PREFIX_REUSE_MODES:
            raise ConfigError(
                f"LlamaCppChatModel: prefix_reuse={prefix_reuse!r} is not one of {', '.join(PREFIX_REUSE_MODES)}."
            )
        self.name = name or Path(model_path).name
        self.model_path = Path(model_path)
        self.prefix_reuse: PrefixReuse = prefix_reuse
        self._lock = threading.Lock()  # a llama.cpp context is not thread-safe
        self.runtime = runtime or LlamaRuntimeSettings.from_env()
        threads = n_threads or max(1, os.cpu_count() or 1)
        # a crash inside llama.cpp would kill this process: try the same load + generation in a child first
        # (imported here so `python -m rvu_pipelines.models.native_probe` does not find itself pre-imported)
        from rvu_pipelines.models.native_probe import ensure_llama_runs

        ensure_llama_runs(self.model_path, settings=self.runtime, n_threads=threads)
        self._llm = open_llama(
            _prefix_llama_class(), model_path, self.runtime, n_ctx=n_ctx, n_threads=threads, seed=seed, verbose=False
        )
        self.prefix_store: KVPrefixStore | None = KVPrefixStore(prefix_cache_bytes) if prefix_reuse == "ram" else None
        self._llm.prefix_store = self.prefix_store
        self._adapters: Any = None  # LlamaAdapterSlots, made on the first adapter load

    # LoRA adapters (models.llama_adapters): loaded into the open model, never a second copy of the weights

    def load_adapter(self, adapter_id: str, gguf_path: Path | str, scale: float = 1.0) -> Any:
        """Add a GGUF LoRA to what the model runs (every KV prefix computed before is dropped); returns the
        ``LoadedAdapter``. Raises ``AdapterLoadError`` naming the file when llama.cpp or the metadata check
        refuses it, ``ValueError`` for an id already loaded."""
        from rvu_pipelines.models.llama_adapters import LlamaAdapterSlots

        with self._lock:  # never while a generation runs on the same context
            if self._adapters is None:
                self._adapters = LlamaAdapterSlots(self._llm)
            return self._adapters.load(adapter_id, gguf_path, scale)

    def unload_adapter(self, adapter_id: str) -> None:
        """Take one adapter out again; raises ``KeyError`` naming what is loaded when ``adapter_id`` is not."""
        with self._lock:
            if self._adapters is None:
                raise KeyError(f"No adapter {adapter_id!r} is loaded (loaded: none).")
            self._adapters.unload(adapter_id)

    def adapter_key(self) -> str:
        """ "" for the base model alone, else a digest of the loaded files and scales: a response cache adds
        it to its key, so answers computed under an adapter never answer the base model (or another adapter)."""
        with self._lock:
            return "" if self._adapters is None else str(self._adapters.adapter_key())

    def active_adapters(self) -> list[str]:
        """Ids of the adapters loaded now, in load order."""
        with self._lock:
            return [] if self._adapters is None else [adapter_id for adapter_id, _ in self._adapters.active()]

    def reset(self) -> None:
        """Forget every reused prefix (live context and snapshots): the next call starts cold."""
        with self._lock:
            self._llm.reset()
            if self.prefix_store is not None:
                self.prefix_store.clear()

    def chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int = 0,
        stop: list[str] | None = None,
    ) -> ChatCompletion:
        import llama_cpp

        with self._lock:
            if self.prefix_reuse == "off":
                self._llm.reset()  # cold: no KV state from an earlier call is reused
            context = self._llm._ctx.ctx
            llama_cpp.llama_perf_context_reset(context)
            started = time.perf_counter()
            response = self._llm.create_chat_completion(
                messages=messages,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
                stop=stop or [],
                repeat_penalty=1.0,  # plain greedy at temperature 0: no repetition penalty
            )
            wall = time.perf_counter() - started
            perf = llama_cpp.llama_perf_context(context)
        choice = response["choices"][0]  # type: ignore[index]
        usage = response["usage"]  # type: ignore[index]
        prompt_s, generation_s = perf.t_p_eval_ms / 1000.0, perf.t_eval_ms / 1000.0
        if prompt_s + generation_s <= 0:  # timings unavailable: attribute the wall time to generation
            prompt_s, generation_s = 0.0, wall
        return ChatCompletion(
            text=choice["message"]["content"] or "",
            model=self.name,
            # tokens actually evaluated this call (a reused KV prefix is not re-evaluated)
            prompt_tokens=int(perf.n_p_eval) or int(usage["prompt_tokens"]),
            completion_tokens=int(usage["completion_tokens"]),
            prompt_seconds=prompt_s,
            generation_seconds=generation_s,
            finish_reason=str(choice.get("finish_reason")),
        )


class OpenAICompatibleChatModel:
    """Any server speaking the OpenAI chat-completions API (llama.cpp server, vLLM, ...)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 300.0,
        extra_body: dict[str, object] | None = None,
    ) -> None:
        """``extra_body`` carries server-specific sampling fields, e.g. {"repeat_penalty": 1.0} for
        llama.cpp's server, whose default 1.1 penalty makes temperature 0 differ from plain greedy."""
        self.name = model
        self.extra_body = dict(extra_body or {})
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s

    def chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int = 0,
        stop: list[str] | None = None,
    ) -> ChatCompletion:
        import requests

        headers = {}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = {
            **self.extra_body,
            "model": self.name,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
        }
        if stop:
            body["stop"] = stop
        started = time.perf_counter()
        response = requests.post(
            f"{self.base_url}/chat/completions", json=body, headers=headers, timeout=self.timeout_s
        )
        wall = time.perf_counter() - started
        response.raise_for_status()
        payload = response.json()
        choice, usage = payload["choices"][0], payload.get("usage", {})
        timings = payload.get("timings") or {}  # llama.cpp's server reports these
        prompt_s = float(timings.get("prompt_ms", 0.0)) / 1000.0
        generation_s = float(timings.get("predicted_ms", 0.0)) / 1000.0 or max(wall - prompt_s, 1e-9)
        return ChatCompletion(
            text=choice["message"].get("content") or "",
            model=payload.get("model", self.name),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            prompt_seconds=prompt_s,
            generation_seconds=generation_s,
            finish_reason=str(choice.get("finish_reason")),
        )
