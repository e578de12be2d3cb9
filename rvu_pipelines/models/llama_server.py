"""llama-cpp-python's OpenAI-compatible server, loading models with the project's llama.cpp settings.

``python -m rvu_pipelines.models.llama_server --model M.gguf --port 8080 ...`` takes exactly the
arguments of ``python -m llama_cpp.server``; the differences:

* every model it loads gets the parameters of ``LlamaRuntimeSettings`` (no extra buffer types unless
  ``RVU_LLAMA_EXTRA_BUFTS=1``), the same as the in-process backend, so the server path cannot take the
  AMX route that crashes;
* chat completions build the prompt with ``models.chat_tokens``, as the in-process backend does: message
  content is tokenized as plain text and cannot forge a turn. The server's completions endpoint only
  takes a string prompt (tokenized with every special string parsed), so a client cannot send token ids
  it built; the chat endpoint is made safe here instead. Every response carries
  ``PLAIN_CONTENT_HEADER`` so ``OpenAICompatibleChatModel`` knows it needs no screening of its own. A
  model whose chat format cannot be rendered that way (a custom or multimodal handler) is refused at load;
* a model setting that names a LoRA adapter (``lora_path``) is refused at load: adapters reach a model only
  through the adapter gate (``adapters.admission``), and the server's own loader would skip it.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from rvu_pipelines.models.chat_tokens import PLAIN_CONTENT_HEADER, PLAIN_CONTENT_VALUE, ChatTokenizer
from rvu_pipelines.models.llama_runtime import (
    LlamaRuntimeSettings,
    model_params_applied,
)

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def plain_content_chat_handler(llama: Any) -> Callable[..., Any]:
    """A ``Llama.chat_handler`` that generates from ``ChatTokenizer`` ids (else like llama-cpp-python's
    template handler). Tools, functions and response formats are refused: they would be rendered as
    template text, and the platform does not send them."""
    from llama_cpp.llama_chat_format import _convert_completion_to_chat

    tokenizer = ChatTokenizer(llama)

    def handler(
        *,
        llama: Any,
        messages: list[dict[str, Any]],
        functions: Any = None,
        function_call: Any = None,
        tools: Any = None,
        tool_choice: Any = None,
        response_format: Any = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        max_tokens: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.1,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: Any = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
        **unknown: Any,
    ) -> Any:
        if llama is not tokenizer._llama:
            raise ValueError("plain_content_chat_handler: called with another model than it was built for.")
        unsupported = {
            "functions": functions,
            "function_call": function_call,
            "tools": tools,
            "tool_choice": tool_choice,
            **unknown,
        }
        if response_format is not None and response_format.get("type", "text") != "text":
            unsupported["response_format"] = response_format
        refused = sorted(name for name, value in unsupported.items() if value is not None)
        if refused:
            raise ValueError(
                f"This server renders chat prompts with plain-text content only; not supported: {refused}."
            )
        prompt = tokenizer.prompt(messages)
        stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        completion = llama.create_completion(
            prompt=prompt.tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            typical_p=typical_p,
            logprobs=top_logprobs if logprobs else None,
            stream=stream,
            stop=stops + prompt.stop,
            seed=seed,
            max_tokens=max_tokens,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            repeat_penalty=repeat_penalty,
            tfs_z=tfs_z,
            mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta,
            model=model,
            logits_processor=logits_processor,
            stopping_criteria=prompt.stopping_criteria,
            grammar=grammar,
            logit_bias=logit_bias,
        )
        return _convert_completion_to_chat(completion, stream=stream)

    return handler


class DeclarePlainContent:
    """ASGI middleware: every HTTP response says that this server tokenizes message content as plain text."""

    def __init__(self, app: Callable[[_Scope, _Receive, _Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_declared(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                header = (PLAIN_CONTENT_HEADER.lower().encode(), PLAIN_CONTENT_VALUE.encode())
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await self.app(scope, receive, send_declared)


class AdapterSettingRefused(ValueError):
    """A server model setting asked for a LoRA adapter, which only the adapter gate may load."""


def refuse_lora_settings(settings: Any) -> None:
    """Raise when a model's server settings name a LoRA adapter (``lora_path`` / ``lora_base``)."""
    named = {key: getattr(settings, key, None) for key in ("lora_path", "lora_base")}
    given = {key: value for key, value in named.items() if value}
    if given:
        model = getattr(settings, "model", "?")
        raise AdapterSettingRefused(
            f"Model {model}: server settings {', '.join(sorted(given))} name a LoRA adapter; the llama.cpp servers "
            "load no adapter, since every adapter load goes through the adapter gate (rvu adapters check, "
            "adapters.admission.LoadGate). Remove the setting and load the adapter in-process behind the gate."
        )


@contextlib.contextmanager
def plain_content_chat() -> Iterator[None]:
    """While open, llama-cpp-python's server gives every model it loads ``plain_content_chat_handler``
    and declares so on every response."""
    import llama_cpp.server.app as server_app
    from llama_cpp.server.model import LlamaProxy

    original_load = LlamaProxy.load_llama_from_model_settings
    original_create_app = server_app.create_app

    def load(settings: Any) -> Any:
        refuse_lora_settings(settings)
        llama = original_load(settings)
        llama.chat_handler = plain_content_chat_handler(llama)
        return llama

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = original_create_app(*args, **kwargs)
        app.add_middleware(DeclarePlainContent)
        return app

    LlamaProxy.load_llama_from_model_settings = staticmethod(load)  # type: ignore[method-assign]
    server_app.create_app = create_app
    try:
        yield
    finally:
        LlamaProxy.load_llama_from_model_settings = staticmethod(original_load)  # type: ignore[method-assign]
        server_app.create_app = original_create_app


def main(argv: list[str] | None = None) -> None:
    settings = LlamaRuntimeSettings.configured()
    sys.argv = ["llama_cpp.server", *(sys.argv[1:] if argv is None else argv)]
    # the whole server lifetime: models loaded later (a request naming another model) get them too
    with model_params_applied(settings), plain_content_chat():
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
