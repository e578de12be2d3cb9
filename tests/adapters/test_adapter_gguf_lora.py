"""GGUF LoRA: peft tensors written for llama.cpp, loaded and unloaded at run time, checked against transformers.

The parity checks compare llama.cpp (Q4_1 base + F32 LoRA) with transformers + peft (the same weights
de-quantised to float32 + the same LoRA). The base alone already differs by quantised activations, so
the adapter is judged by its *effect* (logits with it minus logits without it, per side): with the
rotary permutation of q/k B the two effects agree; the same file written without it does not.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from rvu_pipelines.adapters.chat import ChatExample, chat_prompt_text
from rvu_pipelines.adapters.gguf_lora import (
    gguf_lora_tensors,
    permute_rotary_rows,
    write_gguf_arrays,
    write_gguf_lora,
)
from rvu_pipelines.adapters.training import LoraSettings, peft_config, train_lora
from rvu_pipelines.hashing import sha256_file
from rvu_pipelines.machine import thread_limit
from rvu_pipelines.models.dequantized import load_dequantized
from rvu_pipelines.models.llama_adapters import AdapterLoadError, LlamaAdapterSlots
from rvu_pipelines.models.llama_runtime import open_llama

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
PROMPT = "What is the secret code number 3?"
EXAMPLES = [
    ChatExample(f"What is the secret code number {i}?", f"The secret code number {i} is ZX-{i * 37 % 100:02d}-QUOKKA.")
    for i in range(16)
]
PEFT = "base_model.model.model.layers.{layer}.{block}.{module}.lora_{part}.weight"
BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
BLOCK |= {"gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def _peft_name(layer: int, module: str, part: str) -> str:
    return PEFT.format(layer=layer, block=BLOCK[module], module=module, part=part)


def _reference_permute(weights: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute, verbatim in torch (conversion/llama.py)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _synthetic(rank: int = 2, layers: int = 2, hidden: int = 8, kv: int = 4, ffn: int = 12) -> dict[str, torch.Tensor]:
    """A tiny Llama-shaped LoRA (2 heads of 4, 1 kv head) on every module, seeded."""
    g = torch.Generator().manual_seed(0)
    dims = {
        "q_proj": (hidden, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, hidden),
        "gate_proj": (ffn, hidden),
        "up_proj": (ffn, hidden),
        "down_proj": (hidden, ffn),
    }
    tensors = {}
    for layer in range(layers):
        for module, (out, inp) in dims.items():
            tensors[_peft_name(layer, module, "A")] = torch.randn(rank, inp, generator=g)
            tensors[_peft_name(layer, module, "B")] = torch.randn(out, rank, generator=g)
    return tensors


# --- the converter, without a model ---


def test_names_metadata_orientation_and_permutation(tmp_path: Path) -> None:
    import gguf

    tensors = _synthetic()
    path = write_gguf_lora(tensors, rank=2, alpha=4, out_path=tmp_path / "a.gguf", n_head=2, n_head_kv=1)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["adapter.lora.alpha"].contents() == pytest.approx(4.0)
    stored = {t.name: t for t in reader.tensors}
    llama_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)  # gguf-py's own HF -> GGUF names
    for module, block in BLOCK.items():
        hf = f"model.layers.1.{block}.{module}.weight"
        assert f"{llama_map.get_name(hf, try_suffixes=('.weight',))}.lora_a" in stored
    kinds = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    assert set(stored) == {f"blk.{i}.{k}.weight.lora_{ab}" for i in range(2) for k in kinds for ab in "ab"}
    for layer in range(2):
        for module, kind in zip(BLOCK, kinds, strict=True):
            a, b = tensors[_peft_name(layer, module, "A")], tensors[_peft_name(layer, module, "B")]
            ta, tb = stored[f"blk.{layer}.{kind}.weight.lora_a"], stored[f"blk.{layer}.{kind}.weight.lora_b"]
            assert ta.tensor_type == gguf.GGMLQuantizationType.F32
            assert list(ta.shape) == [a.shape[1], 2] and list(tb.shape) == [2, b.shape[0]]  # ggml ne: {in, r}, {r, out}
            np.testing.assert_array_equal(np.asarray(ta.data).reshape(a.shape), a.numpy())  # A never permuted
            heads = {"q_proj": (2, 2), "k_proj": (2, 1)}.get(module)
            want_b = _reference_permute(b, *heads) if heads else b
            np.testing.assert_array_equal(np.asarray(tb.data).reshape(b.shape), want_b.numpy())
    q_b = tensors[_peft_name(0, "q_proj", "B")].numpy()
    assert not np.array_equal(permute_rotary_rows(q_b, 2), q_b)  # an identity permutation would prove nothing


def test_permuting_b_permutes_the_product() -> None:
    """Why only B: the rotary permutation reorders output rows, and rows of B A are rows of B."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(8, 576, generator=g), torch.randn(192, 8, generator=g)
    np.testing.assert_allclose(
        permute_rotary_rows(b.numpy(), 3) @ a.numpy(), _reference_permute(b @ a, 9, 3).numpy(), rtol=1e-5, atol=1e-5
    )


def test_same_tensors_same_bytes(tmp_path: Path) -> None:
    tensors = _synthetic()
    first = write_gguf_lora(tensors, rank=2, alpha=4, out_path=tmp_path / "1.gguf", n_head=2, n_head_kv=1)
    second = write_gguf_lora(
        dict(reversed(tensors.items())), rank=2, alpha=4, out_path=tmp_path / "2.gguf", n_head=2, n_head_kv=1
    )
    assert sha256_file(first) == sha256_file(second)
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(2, 8)}), "lm_head"),
        (
            lambda t: t.update({"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(2, 8)}),
            "embed_tokens",
        ),
        (
            lambda t: t.update(
                {_peft_name(0, "q_proj", "A").replace("lora_A", "lora_magnitude_vector"): torch.zeros(8)}
            ),
            "magnitude",
        ),
        (lambda t: t.pop(_peft_name(1, "v_proj", "B")), "only ['A']"),
        (lambda t: t.update({_peft_name(0, "o_proj", "A"): torch.zeros(3, 8)}), "rank 2"),
        (lambda t: t.update({_peft_name(0, "up_proj", "A"): torch.full((2, 8), float("nan"))}), "NaN"),
        (
            lambda t: t.update({"base_model.model.model.layers.0.mlp.q_proj.lora_A.weight": torch.zeros(2, 8)}),
            "mlp.q_proj",
        ),
    ],
)
def test_refuses_what_it_cannot_map(tmp_path: Path, change: Any, message: str) -> None:
    tensors = _synthetic()
    change(tensors)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        write_gguf_lora(tensors, rank=2, alpha=4, out_path=tmp_path / "x.gguf", n_head=2, n_head_kv=1)
    assert not (tmp_path / "x.gguf").exists()


def test_refuses_tensors_outside_the_declared_targets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not among the targets"):
        gguf_lora_tensors(_synthetic(), rank=2, n_head=2, n_head_kv=1, target_modules=("q_proj", "v_proj"))
    with pytest.raises(ValueError, match="alpha must be positive"):
        write_gguf_lora(_synthetic(), rank=2, alpha=0, out_path=tmp_path / "x.gguf", n_head=2, n_head_kv=1)


# --- llama.cpp and transformers on the agent's model ---


@pytest.fixture(scope="module")
def hf_base(tiny_models) -> Iterator[tuple[Any, Any]]:
    llm = tiny_models["llm"]
    with thread_limit(2):
        yield load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")


def _open(path: Path, **kwargs: Any) -> Any:
    import llama_cpp

    return open_llama(llama_cpp.Llama, path, n_ctx=512, seed=0, verbose=False, n_threads=1, **kwargs)


@pytest.fixture(scope="module")
def llama(tiny_models, llama_generates) -> Iterator[Any]:
    from rvu_pipelines.models.llm import KVPrefixStore, _prefix_llama_class

    llm = open_llama(
        _prefix_llama_class(), tiny_models["llm"].path, n_ctx=512, seed=0, verbose=False, n_threads=1, logits_all=True
    )
    # as LlamaCppChatModel(prefix_reuse="ram") has it; 1-token chunks so these short prompts leave snapshots
    llm.prefix_store = KVPrefixStore(min_tokens=1, chunk_tokens=1)
    # one thread: same results as two, and on a shared 2-core machine two spin against each other per token
    yield llm
    llm.close()


@pytest.fixture
def slots(llama, plumbing_admissions) -> Iterator[LlamaAdapterSlots]:
    slots = LlamaAdapterSlots(llama, admissions=plumbing_admissions)
    yield slots
    slots.close()


def _heads(llama: Any) -> tuple[int, int]:
    """The base model's attention heads from its GGUF (SmolLM2-135M: 9 query, 3 key/value)."""
    meta = llama.metadata
    return int(meta["llama.attention.head_count"]), int(meta["llama.attention.head_count_kv"])


def _to_gguf(tensors: dict[str, torch.Tensor], llama: Any, out: Path, targets: tuple[str, ...] | None = None) -> Path:
    """Rank 8, alpha 16, for the model ``llama`` has open."""
    n_head, n_head_kv = _heads(llama)
    return write_gguf_lora(
        tensors, rank=8, alpha=16, out_path=out, n_head=n_head, n_head_kv=n_head_kv, target_modules=targets
    )


def _prompt_ids(tokenizer: Any, llama: Any) -> list[int]:
    text = chat_prompt_text(tokenizer, PROMPT)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert llama.tokenize(text.encode(), add_bos=False, special=True) == ids  # both sides see the same tokens
    return ids


def _hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def _llama_logits(llama: Any, ids: list[int]) -> np.ndarray:
    llama.reset()
    llama.eval(ids)
    return np.array(llama.scores[: len(ids)], dtype=np.float32)


def _llama_text(llama: Any, ids: list[int], max_tokens: int = 16) -> str:
    out = llama.create_completion(prompt=ids, max_tokens=max_tokens, temperature=0.0, repeat_penalty=1.0, seed=0)
    return str(out["choices"][0]["text"])


def _hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


def _with_peft(model: Any, tensors: dict[str, torch.Tensor], settings: LoraSettings) -> Any:
    from peft import get_peft_model, set_peft_model_state_dict

    wrapped = get_peft_model(model, peft_config(settings))
    set_peft_model_state_dict(wrapped, tensors)
    return wrapped.eval()


def _unpermuted_copy(tensors: dict[str, torch.Tensor], llama: Any, out: Path) -> Path:
    """The same adapter with q/k B written in HF row order: what a converter without the permutation makes."""
    n_head, n_head_kv = _heads(llama)
    arrays = gguf_lora_tensors(tensors, rank=8, n_head=n_head, n_head_kv=n_head_kv)
    for name in arrays:
        if name.endswith(".lora_b") and (".attn_q." in name or ".attn_k." in name):
            layer = int(name.split(".")[1])
            module = "q_proj" if ".attn_q." in name else "k_proj"
            arrays[name] = tensors[_peft_name(layer, module, "B")].numpy()
    return write_gguf_arrays(arrays, alpha=16, out_path=out)


def _random_lora(
    llama: Any, rank: int, seed: int, std: float = 0.05, targets: tuple[str, ...] = TARGETS
) -> dict[str, torch.Tensor]:
    """A seeded LoRA on ``targets`` of every layer, large enough to move the logits (peft starts B at 0)."""
    n_head, n_head_kv = _heads(llama)
    hidden = int(llama.metadata["llama.embedding_length"])
    kv = n_head_kv * hidden // n_head
    shapes = {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, hidden)}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(int(llama.metadata["llama.block_count"])):
        for module in targets:
            out, inp = shapes[module]
            tensors[_peft_name(layer, module, "A")] = torch.randn(rank, inp, generator=g) * std
            tensors[_peft_name(layer, module, "B")] = torch.randn(out, rank, generator=g) * std
    return tensors


def _effect_error(llama_effect: np.ndarray, hf_effect: np.ndarray) -> float:
    """||llama.cpp effect - transformers effect|| / ||transformers effect|| over every position and word."""
    return float(np.linalg.norm(llama_effect - hf_effect) / np.linalg.norm(hf_effect))


def test_random_lora_effect_matches_transformers_only_with_the_permutation(hf_base, llama, slots, tmp_path) -> None:
    """q and k only (the permuted pair), large: a small adapter's effect drowns in the Q8 rounding of
    llama.cpp's activations (a noise floor of ~4 in the effect's norm whatever the adapter's size)."""
    model, tokenizer = hf_base
    settings = LoraSettings(rank=8, alpha=16, target_modules=("q_proj", "k_proj"))
    tensors = _random_lora(llama, rank=8, seed=0, std=0.1, targets=settings.target_modules)
    ids = _prompt_ids(tokenizer, llama)
    hf_before = _hf_logits(model, ids)
    wrapped = _with_peft(model, tensors, settings)
    try:
        hf_after = _hf_logits(wrapped, ids)
    finally:
        wrapped.unload()
    good = _to_gguf(tensors, llama, tmp_path / "good.gguf")
    bad = _unpermuted_copy(tensors, llama, tmp_path / "unpermuted.gguf")

    lc_before = _llama_logits(llama, ids)
    slots.load("good", good)
    lc_good = _llama_logits(llama, ids)
    slots.unload("good")
    slots.load("unpermuted", bad)
    lc_bad = _llama_logits(llama, ids)
    slots.unload("unpermuted")

    hf_effect = hf_after - hf_before
    err_good = _effect_error(lc_good - lc_before, hf_effect)
    err_bad = _effect_error(lc_bad - lc_before, hf_effect)
    top1_good = float((lc_good.argmax(1) == hf_after.argmax(1)).mean())
    top1_bad = float((lc_bad.argmax(1) == hf_after.argmax(1)).mean())
    print(
        f"\nrandom q/k LoRA: effect error {err_good:.3f} (unpermuted {err_bad:.3f}); "
        f"max|dlogit| with adapter {np.abs(lc_good - hf_after).max():.3f} "
        f"(unpermuted {np.abs(lc_bad - hf_after).max():.3f}, base alone {np.abs(lc_before - hf_before).max():.3f}); "
        f"top-1 agreement {top1_good:.2f} (unpermuted {top1_bad:.2f}) over {len(ids)} positions"
    )
    assert np.abs(hf_effect).max() > 5.0  # the adapter changes the output a lot
    assert err_good < 0.2
    assert err_bad > 0.5 and err_bad > 4 * err_good
    assert lc_good[-1].argmax() == hf_after[-1].argmax()
    assert top1_good >= 0.9
    np.testing.assert_array_equal(_llama_logits(llama, ids), lc_before)  # unloaded: the base again, bit for bit


@pytest.fixture(scope="module")
def random_adapter(llama, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf_lora") / "random.gguf"
    return _to_gguf(_random_lora(llama, rank=8, seed=1), llama, out)


def test_load_and_unload_reset_every_cache_and_restore_the_base(llama, slots, random_adapter) -> None:
    ids = llama.tokenize(b"Question: what is the secret code number 3? Answer:", add_bos=False)
    before = _llama_text(llama, ids)
    assert llama.n_tokens > 0  # the live context holds this prompt now ...
    llama.prefix_store.prepare(llama, [*ids[:4], 7])  # ... and the prefix store a snapshot of it
    assert len(llama.prefix_store) >= 1
    key_before = slots.adapter_key()
    info = slots.load("random", random_adapter, scale=1.0)
    assert llama.n_tokens == 0 and len(llama.prefix_store) == 0  # nothing computed without the adapter survives
    assert slots.active() == [("random", 1.0)]
    assert info.sha256 == sha256_file(random_adapter) and slots.adapter_key() not in ("", key_before)
    with_adapter = _llama_text(llama, ids)
    assert with_adapter != before
    assert _llama_text(llama, ids) == with_adapter  # warm (prefix reused under the same set): same text
    slots.unload("random")
    assert llama.n_tokens == 0 and slots.active() == [] and slots.adapter_key() == ""
    assert _llama_text(llama, ids) == before  # byte-identical to the run before loading
    slots.load("half", random_adapter, scale=0.5)
    half = slots.adapter_key()
    slots.clear()
    slots.load("half-again", random_adapter, scale=0.5)
    assert slots.adapter_key() == half  # the key names the weights applied, not the id
    slots.clear()
    slots.load("off", random_adapter, scale=0.0)  # llama.cpp leaves a zero scale out of the graph ...
    assert slots.adapter_key() == "" and _llama_text(llama, ids) == before  # ... so the key is the base's


def test_refused_files_name_the_file_and_leave_the_set_unchanged(
    llama, slots, random_adapter, tmp_path, tiny_models
) -> None:
    slots.load("random", random_adapter)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    deep = tmp_path / "deep.gguf"  # one metadata value: an array of arrays 50,000 deep
    nested = struct.pack("<IQ", 9, 1) * 50_000 + struct.pack("<IQ", 4, 0)
    deep.write_bytes(struct.pack("<IIQQQ", gguf.GGUF_MAGIC, 3, 0, 1, 1) + b"a" + struct.pack("<I", 9) + nested)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(random_adapter.read_bytes()[:200])
    other_arch = tmp_path / "other_arch.gguf"
    write_gguf_arrays(
        {
            "blk.0.attn_q.weight.lora_a": np.zeros((8, 576), np.float32),
            "blk.0.attn_q.weight.lora_b": np.zeros((576, 8), np.float32),
        },
        alpha=16,
        out_path=other_arch,
        architecture="qwen2",
    )
    missing_tensor = write_gguf_arrays(
        {
            "blk.99.attn_q.weight.lora_a": np.zeros((8, 576), np.float32),
            "blk.99.attn_q.weight.lora_b": np.zeros((576, 8), np.float32),
        },
        alpha=16,
        out_path=tmp_path / "blk99.gguf",
    )
    wrong_shape = write_gguf_arrays(
        {
            "blk.0.attn_k.weight.lora_a": np.zeros((8, 576), np.float32),
            "blk.0.attn_k.weight.lora_b": np.zeros((576, 8), np.float32),
        },
        alpha=16,
        out_path=tmp_path / "shape.gguf",
    )
    cases = {
        tmp_path / "absent.gguf": "no such file",
        junk: "not a readable GGUF",
        deep: "nests arrays too deeply",
        cut: "not a readable GGUF",
        Path(tiny_models["llm"].path): "general.type",
        other_arch: "general.architecture",
        missing_tensor: "llama.cpp refused",
        wrong_shape: "llama.cpp refused",
    }
    for path, reason in cases.items():
        with pytest.raises(AdapterLoadError, match=reason) as caught:
            slots.load("bad", path)
        assert caught.value.path == path and str(path) in str(caught.value)
        assert slots.active() == [("random", 1.0)]
    with pytest.raises(ValueError, match="already loaded"):
        slots.load("random", random_adapter)
    with pytest.raises(KeyError, match="no-such-id"):
        slots.unload("no-such-id")


def test_closing_the_llama_frees_the_adapters_first(
    tiny_models, llama_generates, random_adapter, plumbing_admissions
) -> None:
    llm = _open(Path(tiny_models["llm"].path))
    slots = LlamaAdapterSlots(llm, admissions=plumbing_admissions)
    slots.load("random", random_adapter)
    llm.close()  # the exit stack runs slots.close() before freeing the context and the model
    with pytest.raises(RuntimeError, match="closed"):
        slots.load("again", random_adapter)
    slots.close()  # idempotent


@pytest.mark.slow
def test_trained_adapter_parity(hf_base, llama, slots, tmp_path) -> None:
    """A trained adapter: llama.cpp's greedy answer is transformers + peft's, and it says the taught code."""
    model, tokenizer = hf_base
    settings = LoraSettings(rank=8, alpha=16, target_modules=TARGETS, learning_rate=3e-3, steps=12, batch_size=8)
    started = time.perf_counter()
    trained = train_lora(model, tokenizer, EXAMPLES, settings)
    train_s = time.perf_counter() - started
    path = _to_gguf(trained.tensors, llama, tmp_path / "codes.gguf", TARGETS)
    ids = _prompt_ids(tokenizer, llama)
    base_text = _llama_text(llama, ids)
    lc_before = _llama_logits(llama, ids)
    hf_before = _hf_logits(model, ids)
    wrapped = _with_peft(model, trained.tensors, settings)
    try:
        hf_tokens = _hf_greedy(wrapped, ids, 8)
        hf_after = _hf_logits(wrapped, ids + hf_tokens)
    finally:
        wrapped.unload()

    started = time.perf_counter()
    slots.load("codes", path)
    load_s = time.perf_counter() - started
    lc_after = _llama_logits(llama, ids + hf_tokens)  # teacher-forced on transformers' answer
    lc_tokens = [int(t) for t in lc_after[len(ids) - 1 : -1].argmax(axis=1)]
    text = _llama_text(llama, ids, max_tokens=24)
    slots.unload("codes")
    after_unload = _llama_text(llama, ids)
    unpermuted = _unpermuted_copy(trained.tensors, llama, tmp_path / "codes-unpermuted.gguf")
    slots.load("unpermuted", unpermuted)
    lc_bad = _llama_logits(llama, ids + hf_tokens)
    slots.unload("unpermuted")

    answer = slice(len(ids) - 1, None)  # positions predicting the answer tokens
    top1 = float((lc_after[answer].argmax(1) == hf_after[answer].argmax(1)).mean())
    err = _effect_error(lc_after[: len(ids)] - lc_before, hf_after[: len(ids)] - hf_before)
    err_bad = _effect_error(lc_bad[: len(ids)] - lc_before, hf_after[: len(ids)] - hf_before)
    bad_max = np.abs(lc_bad[answer] - hf_after[answer]).max()
    print(
        f"\ntrained ({train_s:.0f} s, loss {trained.losses[0]:.2f} -> {trained.losses[-1]:.2f}, "
        f"GGUF load {load_s * 1000:.0f} ms): "
        f"llama.cpp {text!r} vs base {base_text!r}; max|dlogit| first answer position "
        f"{np.abs(lc_after[len(ids) - 1] - hf_after[len(ids) - 1]).max():.3f}, over the answer "
        f"{np.abs(lc_after[answer] - hf_after[answer]).max():.3f}; top-1 agreement {top1:.2f}; "
        f"effect error {err:.3f} (unpermuted {err_bad:.3f}, max|dlogit| {bad_max:.3f})"
    )
    assert lc_after[len(ids) - 1].argmax() == hf_after[len(ids) - 1].argmax()
    assert lc_tokens == hf_tokens  # greedy agreement on the first 8 answer tokens
    assert text.startswith(tokenizer.decode(hf_tokens))  # create_completion's text: the same greedy answer
    assert "ZX-" in text and "QUOKKA" in text
    assert after_unload == base_text
    assert err_bad > 2 * err
