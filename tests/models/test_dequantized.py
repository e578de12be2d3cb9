"""The converted-weights cache: the fast from_pretrained load gives the same model as building it from the config
and loading the file into it (the construction it replaced), and every call returns its own copy."""

from __future__ import annotations

import torch

from rvu_pipelines.models.dequantized import converted_folder, load_dequantized


def test_cached_load_equals_the_reference_construction_and_is_a_fresh_copy(tiny_models) -> None:
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM

    llm = tiny_models["llm"]
    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    folder = converted_folder(llm.sha256)
    assert (folder / "model.safetensors").is_file()  # the call above converted it if nothing had

    reference = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(folder), attn_implementation="sdpa", dtype=torch.float32
    )
    load_model(reference, str(folder / "model.safetensors"))
    reference.eval()
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # SmolLM2 ties the output head to the embeddings: a copy would double the memory and drift under training
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert not model.training and model.dtype == torch.float32

    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)

    other, _ = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    with torch.no_grad():
        other.model.embed_tokens.weight.add_(1.0)  # a caller changing its copy touches nobody else's
    assert torch.equal(model.model.embed_tokens.weight, reference.model.embed_tokens.weight)


def test_a_converted_folder_appears_in_one_step_and_a_partial_one_is_replaced(
    tiny_models, tmp_path, monkeypatch
) -> None:
    """Parallel processes share the cache: a reader never sees a half-written folder, a writer that loses the
    race keeps the winner's copy, and a partial folder a crashed writer left is replaced, not trusted."""
    from rvu_pipelines.models import dequantized

    llm = tiny_models["llm"]
    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    monkeypatch.setenv("RVU_SPECTRAL_CACHE", str(tmp_path))

    partial = converted_folder("abc")
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")  # a crashed writer: no weights, no tokenizer
    dequantized._save_converted(model, tokenizer, partial)
    assert dequantized._is_converted(partial)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc"]  # no staging or stale folder left behind

    weights = partial / "model.safetensors"
    before = weights.stat().st_mtime_ns
    dequantized._save_converted(model, tokenizer, partial)  # the loser of a race keeps the finished copy
    assert weights.stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc"]
