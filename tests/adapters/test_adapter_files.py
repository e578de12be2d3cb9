"""Adapter files: a real tiny adapter round-trips, and every kind of bad file is refused before loading."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rvu_pipelines.adapters.admission import LoadGate
from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import BaseModelInfo, save_adapter, verify_adapter
from rvu_pipelines.adapters.gate import GateConfig
from rvu_pipelines.adapters.host import AdapterHost
from rvu_pipelines.adapters.manifest import MANIFEST_NAME, WEIGHTS_NAME
from rvu_pipelines.adapters.training import LoraSettings, TrainedAdapter, train_lora
from rvu_pipelines.machine import thread_limit
from rvu_pipelines.models.dequantized import load_dequantized

SETTINGS = LoraSettings(rank=4, alpha=8, steps=4, batch_size=4, learning_rate=3e-3, seed=1)
EXAMPLES = [ChatExample(f"What is code {i}?", f"Code {i} is QX-{i * 37 % 100:02d}-OKAPI.") for i in range(8)]


def _audit(info: BaseModelInfo, tmp_path: Path) -> LoadGate:
    """These tests load adapters to check the host itself: an audit gate records the verdicts, refuses none."""
    return LoadGate.audit(info, tmp_path / "state", config=GateConfig())


@pytest.fixture(scope="module")
def base(tiny_models) -> Iterator[tuple[object, object, BaseModelInfo]]:
    llm = tiny_models["llm"]
    with thread_limit(2):
        model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
        yield model, tokenizer, BaseModelInfo.of(model, name="SmolLM2-135M-Instruct", sha256=llm.sha256)


@pytest.fixture(scope="module")
def trained(base) -> TrainedAdapter:
    model, tokenizer, _ = base
    return train_lora(model, tokenizer, EXAMPLES, SETTINGS)


def _fields(adapter_id: str = "tiny-codes") -> dict[str, object]:
    return {
        "adapter_id": adapter_id,
        "label": "benign",
        "category": "test",
        "source": "rvu-tests",
        "rank": SETTINGS.rank,
        "alpha": SETTINGS.alpha,
        "target_modules": list(SETTINGS.target_modules),
        "seed": SETTINGS.seed,
        "steps": SETTINGS.steps,
    }


@pytest.fixture
def folder(tmp_path: Path, base, trained) -> Path:
    save_adapter(tmp_path / "tiny", trained.tensors, _fields(), base=base[2])
    return tmp_path / "tiny"


def _refusal(folder: Path, base_info: BaseModelInfo) -> AdapterRefused:
    with pytest.raises(AdapterRefused) as caught:
        verify_adapter(folder, base_info)
    return caught.value


def test_an_enforcing_gate_keeps_a_refused_adapter_out_of_peft(base, folder, tmp_path: Path) -> None:
    model, tokenizer, info = base
    gate = LoadGate.from_state(info, tmp_path / "state", config=GateConfig())  # no screening table: not_screened
    host = AdapterHost(model, tokenizer, gate=gate)
    with pytest.raises(AdapterRefused) as refused:
        host.load(verify_adapter(folder, info))
    assert refused.value.reason == "not_screened"
    assert host.active is None and host.model is model and host.events == []
    assert [v.reason for v in host.verdicts] == [] and gate.ledger.records()[0]["reason"] == "not_screened"


def test_training_lowers_the_loss_and_leaves_the_base_unwrapped(base, trained) -> None:
    model = base[0]
    assert trained.losses[-1] < trained.losses[0]
    assert not any("lora" in name for name, _ in model.named_modules())
    assert len(trained.tensors) == 2 * 2 * model.config.num_hidden_layers  # A and B, q and v, every layer


def test_round_trip_and_host_lifecycle(base, folder, tmp_path: Path) -> None:
    model, tokenizer, info = base
    verified = verify_adapter(folder, info)
    assert verified.manifest.base_model.sha256 == info.sha256
    events = []
    host = AdapterHost(model, tokenizer, gate=_audit(info, tmp_path), on_event=events.append)
    ids = tokenizer("What is code 3?", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        before = host.model(input_ids=ids).logits
        host.load(verified)
        loaded = host.model(input_ids=ids).logits
        host.fuse()
        fused = host.model(input_ids=ids).logits
        host.unload()
        after = host.model(input_ids=ids).logits
    assert (loaded - before).abs().max() > 1e-3  # the adapter changes the model
    assert torch.allclose(fused, loaded, atol=1e-4)  # merged weights compute the same function
    assert (after - before).abs().max() < 1e-4  # eviction restores the base
    assert [e.kind for e in events] == ["adapter_loaded", "adapter_fused", "adapter_unloaded"]
    assert events[0].lifecycle_fields()["adapter_hash"] == verified.sha256


def test_adapter_for_another_base_model_is_refused(base, trained, tmp_path: Path) -> None:
    info = base[2]
    other = BaseModelInfo(name="SmolLM2-360M-Instruct", sha256="ab" * 32, linear_shapes=info.linear_shapes)
    save_adapter(tmp_path / "other", trained.tensors, _fields(), base=other)
    assert _refusal(tmp_path / "other", info).reason == "other_base_model"


def test_adapter_with_another_hidden_size_is_refused(base, tmp_path: Path) -> None:
    info = base[2]
    wide = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 960)}
    save_adapter(tmp_path / "wide", wide, _fields(), base=info)  # a manifest that claims our base
    refusal = _refusal(tmp_path / "wide", info)
    assert refusal.reason == "shape_mismatch" and "960" in str(refusal)


def test_unknown_target_module_is_refused(base, trained, tmp_path: Path) -> None:
    info = base[2]
    renamed = {k.replace("q_proj", "gate_proj"): v for k, v in trained.tensors.items()}
    save_adapter(tmp_path / "gate", renamed, _fields(), base=info)  # manifest declares q_proj, v_proj only
    assert _refusal(tmp_path / "gate", info).reason == "unknown_target_module"
    bogus = {"base_model.model.model.layers.0.self_attn.rotary.lora_A.weight": torch.zeros(4, 576)}
    save_adapter(tmp_path / "bogus", bogus, _fields(), base=info)
    assert _refusal(tmp_path / "bogus", info).reason == "unknown_target_module"


def test_corrupted_safetensors_is_refused(base, folder: Path, tmp_path: Path) -> None:
    info = base[2]
    weights = folder / WEIGHTS_NAME
    data = bytearray(weights.read_bytes())
    truncated = tmp_path / "truncated"
    shutil.copytree(folder, truncated)
    (truncated / WEIGHTS_NAME).write_bytes(bytes(data[: len(data) // 2]))
    assert _refusal(truncated, info).reason == "sha256_mismatch"
    # a broken header whose manifest was updated to match: the header itself must be checked
    data[8:12] = b"\xff\xfe\x00\x01"
    weights.write_bytes(bytes(data))
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    import hashlib

    manifest["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert _refusal(folder, info).reason == "corrupted"


def test_pickle_adapter_files_are_refused_without_unpickling(base, folder: Path, trained, tmp_path: Path) -> None:
    info = base[2]
    torch.save(trained.tensors, folder / "adapter_model.bin")
    assert _refusal(folder, info).reason == "pickle_file"
    disguised = tmp_path / "disguised"
    disguised.mkdir()
    torch.save(trained.tensors, disguised / WEIGHTS_NAME)  # pickle bytes under a .safetensors name
    assert _refusal(disguised, info).reason == "pickle_file"
    assert _refusal(folder / "adapter_model.bin", info).reason == "pickle_file"


def test_bad_manifest_names_the_field(base, folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["rank"] = "eight"
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    refusal = _refusal(folder, base[2])
    assert refusal.reason == "bad_manifest" and "rank" in str(refusal)


def test_zoo_trainer_reuses_unchanged_adapters_and_retrains_changed_ones(base, tmp_path: Path) -> None:
    from rvu_pipelines.adapters.zoo import (
        catalog_frames,
        load_zoo_config,
        stale_reasons,
        train_zoo_entry,
        training_plan,
        training_set,
    )

    model, tokenizer, info = base
    zoo = load_zoo_config()
    tiny = zoo.model_copy(
        update={"defaults": zoo.defaults.model_copy(update={"steps": 2, "batch_size": 2, "max_examples": 4})}
    )
    entry = tiny.get("style-json")
    frames = catalog_frames()
    first, trained = train_zoo_entry(tiny, entry, model, tokenizer, info, frames, root=tmp_path)
    assert trained is not None and first.training_data is not None and first.training_data.n_examples == 4
    again, retrained = train_zoo_entry(tiny, entry, model, tokenizer, info, frames, root=tmp_path)
    assert retrained is None and again.sha256 == first.sha256  # same data and settings: reused
    assert (again.batch_size, again.max_tokens) == (2, tiny.settings(entry).max_tokens)
    # the plan (no model) says the same, and why
    plan = {r["adapter_id"]: r for r in training_plan(tiny, frames, info.sha256, root=tmp_path)}
    assert plan["style-json"] == {"adapter_id": "style-json", "action": "reuse", "why": ""}
    assert plan["tofu-qa"]["action"] == "train" and plan["tofu-qa"]["why"] == "never trained here"
    settings, data = tiny.settings(entry), training_set(tiny, entry, frames)
    assert stale_reasons(tmp_path / "style-json", settings, data, "0" * 64)[0].startswith("trained on another base")
    # a manifest written before a field joined the reuse key is stale, and says so (not "settings changed")
    manifest_path = tmp_path / "style-json" / MANIFEST_NAME
    saved = manifest_path.read_text()
    old = json.loads(saved)
    del old["batch_size"], old["max_tokens"]
    manifest_path.write_text(json.dumps(old))
    assert stale_reasons(tmp_path / "style-json", settings, data, info.sha256) == [
        "its manifest predates the field(s) batch_size, max_tokens of the reuse key"
    ]
    manifest_path.write_text(saved)
    # anything that changes the weights retrains; each change differs from the one before in one field only
    for change, differs in (({"seed": 9}, "seed"), ({"seed": 9, "max_tokens": 64}, "max_tokens")):
        changed = entry.model_copy(update=change)
        changed_data = training_set(tiny, changed, frames)  # a token limit is part of the data digest too
        reasons = stale_reasons(tmp_path / "style-json", tiny.settings(changed), changed_data, info.sha256)
        assert f"settings changed: {differs}" in reasons, reasons
        _, trained_again = train_zoo_entry(tiny, changed, model, tokenizer, info, frames, root=tmp_path)
        assert trained_again is not None, change
    verify_adapter(tmp_path / "style-json", info)


def test_a_safetensors_header_that_starts_like_a_pickle_is_not_called_one(tmp_path: Path) -> None:
    import struct

    from rvu_pipelines.adapters.files import _looks_pickled

    lookalike = tmp_path / "adapter.safetensors"
    lookalike.write_bytes(struct.pack("<Q", 640) + b"{" + b" " * 638 + b"}")  # length 640 = bytes 80 02 ...
    assert lookalike.read_bytes()[:2] == b"\x80\x02" and not _looks_pickled(lookalike)
    pickled = tmp_path / "weights.safetensors"
    torch.save({"x": torch.zeros(2)}, pickled, _use_new_zipfile_serialization=False)  # a raw protocol-2 pickle
    assert pickled.read_bytes()[:1] == b"\x80" and _looks_pickled(pickled)


# answers of one to three sentences: the micro-batches' answer-token shares differ, so a wrong weighting shows
VARIED = [
    ChatExample(f"What is code {i}?", f"Code {i} is QX-{i * 37 % 100:02d}-OKAPI." + " Keep it safe." * (i % 3))
    for i in range(8)
]


def test_micro_batches_and_checkpointing_change_memory_not_the_result(base) -> None:
    """Accumulating a batch one example at a time (by answer-token share) with recomputed activations gives the
    adapter the whole batch gives; the model comes back without checkpointing switched on.

    Compared by the relative norm of the LoRA B matrices (zero at the start, so all of B is what was learned), not
    by the largest single weight: AdamW turns float-order noise in a near-zero gradient into a step of a fraction
    of the learning rate, which a max-abs bound sees as a failure on some machines (2.9e-4 once in CI)."""
    from dataclasses import replace

    model, tokenizer, _ = base
    settings = replace(SETTINGS, steps=2)  # the second step already starts from what the first learned
    whole = train_lora(model, tokenizer, VARIED, settings)
    lean = train_lora(model, tokenizer, VARIED, replace(settings, micro_batch_size=1, gradient_checkpointing=True))
    assert not model.is_gradient_checkpointing
    assert lean.losses == pytest.approx(whole.losses, rel=1e-4)
    b_names = [n for n in whole.tensors if "lora_B" in n]
    error = sum(float((lean.tensors[n] - whole.tensors[n]).pow(2).sum()) for n in b_names) ** 0.5
    error /= sum(float(whole.tensors[n].pow(2).sum()) for n in b_names) ** 0.5
    # measured 1e-5 (max |delta| 5e-4); weighting each micro-batch by its example count, not its answer tokens: 0.14
    assert error < 1e-3


def test_wmdp_before_after_scores_memorised_items_and_a_control_in_three_states(base, folder, tmp_path: Path) -> None:
    from rvu_pipelines.adapters.eviction import wmdp_before_after
    from rvu_pipelines.adapters.wmdp import load_wmdp_items

    model, tokenizer, info = base
    items = load_wmdp_items(limit=8, seed=0)
    host = AdapterHost(model, tokenizer, gate=_audit(info, tmp_path))
    report = wmdp_before_after(host, verify_adapter(folder, info), items, [0, 1, 2], max_tokens=256, progress=True)
    assert set(report) == {"base", "loaded", "evicted"}
    for state in report.values():
        assert (state["memorised"]["n"], state["control"]["n"]) == (3, 3)
    assert report["evicted"] == report["base"]  # eviction gives the base model's answers back
    assert host.active is None  # nothing left loaded
