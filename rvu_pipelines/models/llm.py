"""Chat models behind one interface: llama.cpp in-process (default) or an OpenAI-compatible server.

Both are deterministic by default (temperature 0, fixed seed) and report how long the prompt and
the generation took, so throughput is measured the same way whichever backend runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.hashing import sha256_bytes, sha256_file
from rvu_pipelines.machine import usable_cores
from rvu_pipelines.models.chat_tokens import (
    PLAIN_CONTENT_HEADER,
    PLAIN_CONTENT_VALUE,
    ChatTokenizer,
    ControlTokenError,
    control_strings,
    neutralise_control_strings,
)
from rvu_pipelines.models.kv_prefixes import CHUNK_TOKENS, KVDiskCache, KVNamespace, KVPrefixStore
from rvu_pipelines.models.llama_runtime import LlamaRuntimeSettings, llama_build_fingerprint, open_llama
from rvu_pipelines.paths import kv_prefix_dir
from rvu_pipelines.settings import kv_cache_bytes

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

    def adapter_files(self) -> list[str]: ...


def adapter_key_of(model: object) -> str:
    """The adapter part of a completion-cache key: "" for a model that cannot host adapters."""
    return str(model.adapter_key()) if isinstance(model, AdapterHostingModel) else ""


def adapter_files_of(model: object) -> list[str]:
    """The sha256 of every adapter GGUF shaping ``model``'s answers now ([] for the base model alone)."""
    return sorted(str(s) for s in model.adapter_files()) if isinstance(model, AdapterHostingModel) else []


PrefixReuse = Literal["off", "last", "ram", "disk"]
PREFIX_REUSE_MODES: tuple[str, ...] = ("off", "last", "ram", "disk")


def kv_disk_cache(directory: Path | str | None = None, capacity: int | None = None) -> KVDiskCache | None:
    """The disk tier in ``directory`` bounded by ``capacity`` bytes (defaults: RVU_KV_CACHE_DIR and
    RVU_KV_CACHE_BYTES); None when the bound is 0."""
    capacity = kv_cache_bytes() if capacity is None else capacity
    if capacity <= 0:
        return None
    return KVDiskCache(Path(directory or kv_prefix_dir()), capacity)  # the folder is made 0700 on write


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

    The prompt is built by ``models.chat_tokens``: only the chat template's own text becomes control
    tokens, every message's content is tokenized as plain text, so a tool output or a retrieved document
    holding ``<|im_end|>\\n<|im_start|>user`` cannot forge a turn (benign prompts get the same ids as
    llama-cpp-python's ``create_chat_completion`` gave them).

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
        adapter_gate: Any = None,
    ) -> None:
        if prefix_reuse not in PREFIX_REUSE_MODES:
            raise ConfigError(
                f"LlamaCppChatModel: prefix_reuse={prefix_reuse!r} is not one of {', '.join(PREFIX_REUSE_MODES)}."
            )
        self.name = name or Path(model_path).name
        self.model_path = Path(model_path)
        self._lock = threading.Lock()  # a llama.cpp context is not thread-safe
        self.runtime = runtime or LlamaRuntimeSettings.configured()
        self.n_ctx, self.n_threads = int(n_ctx), n_threads or usable_cores()
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
        self.adapter_gate = adapter_gate  # models.llama_adapters.AdapterAdmissions; None: no adapter loads
        self._chat_tokens: ChatTokenizer | None = None  # made on the first chat (reads the whole vocabulary)

    # LoRA adapters (models.llama_adapters): loaded into the open model, never a second copy of the weights

    def load_adapter(self, adapter_id: str, gguf_path: Path | str, scale: float = 1.0) -> Any:
        """Add a GGUF LoRA to what the model runs (every KV prefix computed before is dropped); returns the
        ``LoadedAdapter``. Only a file the adapter gate (``adapter_gate``) admitted loads: the gate raises its
        refusal (``AdapterRefused``), a model without a gate ``AdapterLoadError``, as does llama.cpp or the
        metadata check refusing the file; ``ValueError`` for an id already loaded."""
        from rvu_pipelines.models.llama_adapters import LlamaAdapterSlots

        with self._lock:  # never while a generation runs on the same context
            if self._adapters is None:
                self._adapters = LlamaAdapterSlots(self._llm, admissions=self.adapter_gate)
            self._adapters.admissions = self.adapter_gate  # a gate attached after the first load counts too
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

    def adapter_files(self) -> list[str]:
        """The sha256 of each adapter GGUF the answers depend on now (``LlamaAdapterSlots.adapter_files``)."""
        with self._lock:
            return [] if self._adapters is None else list(self._adapters.adapter_files())

    def kv_namespace(self) -> KVNamespace:
        """What a KV state of this model depends on besides its tokens (called under the chat lock)."""
        if self._namespace_base is None:
            sha = self._model_sha256 or sha256_file(self.model_path)
            build = sha256_bytes(json.dumps(llama_build_fingerprint(self.runtime), sort_keys=True).encode())
            self._namespace_base = (sha, build)
        adapter_key = "" if self._adapters is None else str(self._adapters.adapter_key())
        files = () if self._adapters is None else tuple(self._adapters.adapter_files())
        sha, build = self._namespace_base
        return KVNamespace(sha, build, self.n_ctx, self.n_threads, CHUNK_TOKENS, adapter_key, files)

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        """The model's tokens for ``text`` as llama.cpp counts them (special-token text stays text)."""
        with self._lock:
            return list(self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False))

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
            if self._chat_tokens is None:
                self._chat_tokens = ChatTokenizer(self._llm, model_name=self.name)
            prompt = self._chat_tokens.prompt(messages)  # content is plain text: it cannot forge a turn
            if self.prefix_reuse == "off":
                self._llm.reset()  # cold: no KV state from an earlier call is reused
            context = self._llm._ctx.ctx
            llama_cpp.llama_perf_context_reset(context)
            started = time.perf_counter()
            response = self._llm.create_completion(  # the sampling create_chat_completion used, on our tokens
                prompt=prompt.tokens,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=0.95,
                top_k=40,
                min_p=0.05,
                typical_p=1.0,
                seed=seed,
                stop=[*(stop or []), *prompt.stop],
                stopping_criteria=prompt.stopping_criteria,
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
            text=choice["text"] or "",
            model=self.name,
            # tokens actually evaluated this call (a reused KV prefix is not re-evaluated)
            prompt_tokens=int(perf.n_p_eval) or int(usage["prompt_tokens"]),
            completion_tokens=int(usage["completion_tokens"]),
            prompt_seconds=prompt_s,
            generation_seconds=generation_s,
            finish_reason=str(choice.get("finish_reason")),
        )


ControlTokenPolicy = Literal["auto", "neutralise", "refuse", "keep"]
CONTROL_TOKEN_POLICIES: tuple[str, ...] = ("auto", "neutralise", "refuse", "keep")


class OpenAICompatibleChatModel:
    """Any server speaking the OpenAI chat-completions API (llama.cpp server, vLLM, ...).

    **What is guaranteed about control tokens.** The server renders the chat template and tokenizes the
    prompt; this client cannot see its tokenizer, so it cannot guarantee that message content stays plain
    text there. The servers the platform runs itself (``models.llama_server``: the scale profile's) build
    the prompt with ``models.chat_tokens`` and say so in a response header, and then content is plain text
    by construction, as in-process. For any other server the client can only screen content:
    ``control_tokens`` says what happens to well-known chat control-token strings (ChatML, Llama-2/3,
    Mistral, Gemma, Phi-3, DeepSeek, any ``<|name|>``) in non-system messages before they are sent:
    "neutralise" breaks each one with a space, "refuse" raises ``ControlTokenError``, "keep" sends them
    as they are, and "auto" (the default) keeps them for a server that declares plain-text content
    tokenization and neutralises them otherwise. Screening is defense in depth, not a guarantee: a
    model with control strings outside that list is not covered, and system messages (written by the
    platform) are sent as they are.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        extra_body: dict[str, object] | None = None,
        control_tokens: ControlTokenPolicy = "auto",
    ) -> None:
        """``extra_body`` carries server-specific sampling fields, e.g. {"repeat_penalty": 1.0} for
        llama.cpp's server, whose default 1.1 penalty makes temperature 0 differ from plain greedy.
        ``api_key``: sent as a bearer token; kept private, never in a record or a message."""
        if control_tokens not in CONTROL_TOKEN_POLICIES:
            raise ConfigError(
                f"OpenAICompatibleChatModel: control_tokens={control_tokens!r} is not one of "
                f"{', '.join(CONTROL_TOKEN_POLICIES)}."
            )
        self.name = model
        self.extra_body = dict(extra_body or {})
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.control_tokens: ControlTokenPolicy = control_tokens
        self._server_plain_content: bool | None = None  # "auto": what the server declared (asked once)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def server_tokenizes_content_as_text(self) -> bool:
        """Whether the server declares (``PLAIN_CONTENT_HEADER`` on ``/models``) that it tokenizes message
        content as plain text; asked once, and asked again after a failed request."""
        import requests

        if self._server_plain_content is None:
            try:
                response = requests.get(f"{self.base_url}/models", headers=self._headers(), timeout=self.timeout_s)
            except requests.RequestException:
                return False
            declared = response.headers.get(PLAIN_CONTENT_HEADER, "")
            self._server_plain_content = response.ok and declared.lower() == PLAIN_CONTENT_VALUE
        return self._server_plain_content

    def screened(self, messages: list[Message]) -> list[Message]:
        """``messages`` as they will be sent under ``control_tokens`` (system messages untouched)."""
        policy = self.control_tokens
        if policy == "auto":
            policy = "keep" if self.server_tokenizes_content_as_text() else "neutralise"
        if policy == "keep":
            return messages
        screened: list[Message] = []
        for index, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") == "system" or not isinstance(content, str) or not control_strings(content):
                screened.append(message)
            elif policy == "refuse":
                found = ", ".join(sorted(set(control_strings(content))))
                raise ControlTokenError(
                    f"{self.name}: message {index} ({message.get('role')}) holds chat control-token text "
                    f"({found}); refused (control_tokens='refuse')."
                )
            else:
                screened.append({**message, "content": neutralise_control_strings(content)})
        return screened

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

        headers = self._headers()
        body = {
            **self.extra_body,
            "model": self.name,
            "messages": self.screened(messages),
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
