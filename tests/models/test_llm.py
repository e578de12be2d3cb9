"""Real generations with SmolLM2: deterministic in-process, and the same through an OpenAI-compatible server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import requests

from rvu_pipelines.models import OpenAICompatibleChatModel
from rvu_pipelines.smoke import run_llm_smoke

MESSAGES = [{"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "What colour is the sky on a clear day?"}]


def test_two_temperature_zero_generations_are_identical(smollm) -> None:
    first = smollm.chat(MESSAGES, max_tokens=32, temperature=0.0, seed=0)
    second = smollm.chat(MESSAGES, max_tokens=32, temperature=0.0, seed=0)
    assert first.text == second.text
    assert first.text.strip()
    assert first.completion_tokens > 0 and first.generation_tokens_per_s > 0 and first.prompt_tokens_per_s > 0


def test_smoke_reports_throughput_and_determinism(smollm) -> None:
    result = run_llm_smoke(smollm, max_tokens=24)
    assert result.deterministic
    assert result.first.prompt_tokens > 10


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration
def test_openai_compatible_backend_against_llama_cpp_server(tiny_models, smollm) -> None:
    """The scale-out path: llama.cpp's own OpenAI-compatible server on loopback, same model, same answer."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(tiny_models["llm"].path), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "2048", "--model_alias", "smollm2",
         "--n_threads", str(os.cpu_count() or 1), "--seed", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.5)
        else:
            pytest.fail("llama_cpp.server did not start within 90 s")
        remote = OpenAICompatibleChatModel(f"http://127.0.0.1:{port}/v1", "smollm2",
                                           extra_body={"repeat_penalty": 1.0})
        over_http = remote.chat(MESSAGES, max_tokens=32, temperature=0.0, seed=0)
        in_process = smollm.chat(MESSAGES, max_tokens=32, temperature=0.0, seed=0)
        assert over_http.text == in_process.text
        assert over_http.completion_tokens == in_process.completion_tokens
    finally:
        server.terminate()
        server.wait(timeout=30)
