"""Chat models behind one interface: llama.cpp in-process (default) or an OpenAI-compatible server.

Both are deterministic by default (temperature 0, fixed seed) and report how long the prompt and
the generation took, so throughput is measured the same way whichever backend runs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.hashing import sha256_bytes, sha256_file
from rvu_pipelines.models.kv_prefixes import CHUNK_TOKENS, KVDiskCache, KVNamespace, KVPrefixStore
from rvu_pipelines.models.llama_runtime import LlamaRuntimeSettings, llama_build_fingerprint, open_llama
from rvu_pipelines.paths import state_dir
from rvu_pipelines.settings import env_value

Message = dict[str, str]

KV_CACHE_DIR_ENV = "RVU_KV_CACHE_DIR"
KV_CACHE_BYTES_ENV = "RVU_KV_CACHE_BYTES"
DEFAULT_KV_CACHE_BYTES = 1 << 30


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


PrefixReuse = Literal["off", "last", "ram", "disk"]
PREFIX_REUSE_MODES: tuple[str, ...] = ("off", "last", "ram", "disk")


def kv_disk_cache(directory: Path | str | None = None) -> KVDiskCache | None:
    """The disk tier from RVU_KV_CACHE_DIR / RVU_KV_CACHE_BYTES (None when the byte bound is 0)."""
    raw = env_value(KV_CACHE_BYTES_ENV) or str(DEFAULT_KV_CACHE_BYTES)
    try:
        capacity = int(raw)
    except ValueError as exc:
        raise ConfigError(
            f"{KV_CACHE_BYTES_ENV}={raw!r} is not a whole number of bytes (0 turns the disk tier off)."
        ) from exc
    if capacity <= 0:
        return None
    folder = directory or env_value(KV_CACHE_DIR_ENV) or state_dir() / "cache" / "kv_prefixes"  # made 0700 on write
    return KVDiskCache(Path(folder), capacity)


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

    ``prefix_reuse`` says how the KV state of a shared prompt prefix is reused across calls (all reuse
    is chunk-aligned, ``models.kv_prefixes``, so text and logits equal a cold evaluation's bit for bit):
    "off" resets the context before every call (the cold baseline); "last" reuses what the previous
    call left; "ram" adds snapshots so interleaved prefixes (an agent and a judge) are each evaluated
    once per process; "disk" (the default) also keeps prefixes that different prompts shared in
    ``RVU_KV_CACHE_DIR`` (bounded by ``RVU_KV_CACHE_BYTES``; 0 = "ram"), so a new process starts warm.
    ``prefix_cache_bytes`` bounds the RAM snapshots (~23 KB per token for SmolLM2-135M; least recently
    used first out). ``model_sha256`` keys the disk files (computed from the file when not given).
    ``runtime`` holds the llama.cpp model parameters the project sets (default from the environment: no
    extra buffer types, see ``llama_runtime``); the first load of a model on a machine is tried in a
    child process first (``native_probe``).
    """

    def __init__(
        self,
        model_path: Path,
        *,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 0,
        name: str | None = None,
        prefix_reuse: PrefixReuse = "disk",
        prefix_cache_bytes: int = 512 << 20,
        runtime: LlamaRuntimeSettings | None = None,
        model_sha256: str | None = None,
        kv_cache_dir: Path | str | None = None,
    ) -> None:
        if prefix_reuse not in PREFIX_REUSE_MODES:
            raise ConfigError(
                f"LlamaCppChatModel: prefix_reuse={prefix_reuse!r} is not one of {', '.join(PREFIX_REUSE_MODES)}."
            )
        self.name = name or Path(model_path).name
        self.model_path = Path(model_path)
        self._lock = threading.Lock()  # a llama.cpp context is not thread-safe
        self.runtime = runtime or LlamaRuntimeSettings.from_env()
        self.n_ctx, self.n_threads = int(n_ctx), n_threads or max(1, os.cpu_count() or 1)
        self._model_sha256 = model_sha256
        # a crash inside llama.cpp would kill this process: try the same load + generation in a child first
        # (imported here so `python -m rvu_pipelines.models.native_probe` does not find itself pre-imported)
        from rvu_pipelines.models.native_probe import ensure_llama_runs

        ensure_llama_runs(self.model_path, settings=self.runtime, n_threads=self.n_threads)
        self._llm = open_llama(
            _prefix_llama_class(),
            model_path,
            self.runtime,
            n_ctx=n_ctx,
            n_threads=self.n_threads,
            n_batch=CHUNK_TOKENS,  # prompts evaluate in the chunks prefix reuse is aligned to
            n_ubatch=CHUNK_TOKENS,
            seed=seed,
            verbose=False,
        )
        disk = kv_disk_cache(kv_cache_dir) if prefix_reuse == "disk" else None
        if prefix_reuse == "disk" and disk is None:
            prefix_reuse = "ram"
        self.prefix_reuse: PrefixReuse = prefix_reuse
        self.prefix_store: KVPrefixStore | None = None
        if prefix_reuse != "off":
            self.prefix_store = KVPrefixStore(
                prefix_cache_bytes if prefix_reuse in ("ram", "disk") else 0,
                disk=disk,
                namespace=self.kv_namespace if disk is not None else None,
            )
        self._llm.prefix_store = self.prefix_store
        self._namespace_base: tuple[str, str] | None = None
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

    def kv_namespace(self) -> KVNamespace:
        """What a KV state of this model depends on besides its tokens (called under the chat lock)."""
        if self._namespace_base is None:
            sha = self._model_sha256 or sha256_file(self.model_path)
            build = sha256_bytes(json.dumps(llama_build_fingerprint(self.runtime), sort_keys=True).encode())
            self._namespace_base = (sha, build)
        adapter_key = "" if self._adapters is None else str(self._adapters.adapter_key())
        sha, build = self._namespace_base
        return KVNamespace(sha, build, self.n_ctx, self.n_threads, CHUNK_TOKENS, adapter_key)

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
