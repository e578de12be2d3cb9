"""Chat models behind one interface: llama.cpp in-process (default) or an OpenAI-compatible server.

Both are deterministic by default (temperature 0, fixed seed) and report how long the prompt and
the generation took, so throughput is measured the same way whichever backend runs.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

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


class LlamaCppChatModel:
    """A GGUF model run in-process by llama-cpp-python."""

    def __init__(self, model_path: Path, *, n_ctx: int = 2048, n_threads: int | None = None, seed: int = 0,
                 name: str | None = None) -> None:
        from llama_cpp import Llama

        self.name = name or Path(model_path).name
        self.model_path = Path(model_path)
        self._lock = threading.Lock()  # a llama.cpp context is not thread-safe
        self._llm = Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=n_threads or max(1, os.cpu_count() or 1),
            seed=seed,
            verbose=False,
        )

    def chat(self, messages: list[Message], *, max_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
             stop: list[str] | None = None) -> ChatCompletion:
        import llama_cpp

        with self._lock:
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

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 300.0, extra_body: dict[str, object] | None = None) -> None:
        """``extra_body`` carries server-specific sampling fields, e.g. {"repeat_penalty": 1.0} for
        llama.cpp's server, whose default 1.1 penalty makes temperature 0 differ from plain greedy."""
        self.name = model
        self.extra_body = dict(extra_body or {})
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s

    def chat(self, messages: list[Message], *, max_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
             stop: list[str] | None = None) -> ChatCompletion:
        import requests

        headers = {}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = {**self.extra_body, "model": self.name, "messages": messages, "max_tokens": max_tokens,
                "temperature": temperature, "seed": seed}
        if stop:
            body["stop"] = stop
        started = time.perf_counter()
        response = requests.post(f"{self.base_url}/chat/completions", json=body, headers=headers,
                                 timeout=self.timeout_s)
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
