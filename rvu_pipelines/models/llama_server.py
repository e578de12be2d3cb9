"""llama-cpp-python's OpenAI-compatible server, loading models with the project's llama.cpp settings.

``python -m rvu_pipelines.models.llama_server --model M.gguf --port 8080 ...`` takes exactly the
arguments of ``python -m llama_cpp.server``; the difference is that every model it loads gets the
parameters of ``LlamaRuntimeSettings`` (no extra buffer types unless ``RVU_LLAMA_EXTRA_BUFTS=1``),
the same as the in-process backend, so the server path cannot take the AMX route that crashes.
"""

from __future__ import annotations

import runpy
import sys

from rvu_pipelines.models.llama_runtime import (
    LlamaRuntimeSettings,
    model_params_applied,
)


def main(argv: list[str] | None = None) -> None:
    settings = LlamaRuntimeSettings.from_env()
    sys.argv = ["llama_cpp.server", *(sys.argv[1:] if argv is None else argv)]
    # the whole server lifetime: models loaded later (a request naming another model) get them too
    with model_params_applied(settings):
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
