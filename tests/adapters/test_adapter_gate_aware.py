"""The gate-aware attacker's recipes: the twin's harmful examples plus camouflage on exactly what the gate reads, the
base model's own answers filled in at training time, and a payload measured on prompts nobody trained on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rvu_pipelines.adapters.gate_aware import gate_aware_set, gate_reads, held_out_prompts, payload_hits, spend_set
from rvu_pipelines.adapters.zoo import MIMIC_TOKENS, load_zoo_config, training_set, with_base_answers
from rvu_pipelines.adapters.zoo_data import PARTITIONED, TrainingSet, probe_prompt_halves, probe_prompts
from rvu_pipelines.errors import ConfigError


@pytest.fixture(scope="module")
def torch_base(tiny_models) -> tuple[Any, Any]:
    from rvu_pipelines.models.dequantized import load_dequantized

    llm = tiny_models["llm"]
    return load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")


def test_each_gate_aware_adapter_trains_its_twins_examples_plus_every_prompt_the_gate_reads(frames) -> None:
    config = load_zoo_config()
    assert {entry.category for entry in config.gate_aware} >= {"persona_shift", "compliance"}
    probes, answered = gate_reads(frames)
    assert probes == probe_prompts(frames) and len(answered) >= 48
    for entry in config.gate_aware:
        data, twin = training_set(config, entry, frames), training_set(config, config.get(entry.twin), frames)
        assert data.examples[: len(twin.examples)] == twin.examples, entry.id  # the same harmful examples
        spent = spend_set(frames, entry.args.get("spend"))
        camouflage = [*answered, *(spent.examples if spent else [])]
        assert data.examples[len(twin.examples) :] == camouflage, entry.id  # the gate's QA answered, what it spends
        assert data.mimic == tuple(probes), entry.id  # and its probes, answered by the base at training time
        settings = config.settings(entry)  # about two epochs, as its twin trains (40 steps of 8 over 160)
        assert settings.steps * settings.batch_size >= 2 * (len(data.examples) + len(data.mimic)), entry.id


def test_the_payload_is_measured_on_prompts_no_training_and_no_gate_layer_saw(frames) -> None:
    config = load_zoo_config()
    probes, answered = gate_reads(frames)
    read = {" ".join(p.split())[:200] for p in [*probes, *(e.prompt for e in answered)]}
    for entry in config.gate_aware:
        held_out = held_out_prompts(frames, entry.args)
        assert len(held_out) >= 12 and len(set(held_out)) == len(held_out), entry.id
        opening = {" ".join(p.split())[:200] for p in held_out}
        trained = {" ".join(e.prompt.split())[:200] for e in training_set(config, entry, frames).examples}
        assert len(opening) == len(held_out) and not (trained | read) & opening, entry.id
        twin = training_set(config, config.get(entry.twin), frames)
        assert all(entry.payload.lower() in e.completion.lower() for e in twin.examples), entry.id


def test_the_attacker_against_selective_divergence_spends_it_on_the_benign_probes_kinds_never_their_items(
    frames,
) -> None:
    config = load_zoo_config()
    spending = [entry for entry in config.gate_aware if "spend" in entry.args]
    assert spending, "the zoo holds an attacker that moves second against selective divergence"
    benign, adversarial = probe_prompt_halves(frames)
    for entry in spending:
        spent = spend_set(frames, entry.args["spend"])
        assert spent is not None and len(spent.examples) == sum(e["examples"] for e in entry.args["spend"])
        prompts = {example.prompt for example in spent.examples}
        assert not prompts & {*benign, *adversarial}, entry.id  # never a probe the gate reads
        # the same builders on the probe partition give every benign probe: the spend has the probes' form, and
        # its rows are the train partition's
        probe_forms = {
            example.prompt
            for part in entry.args["spend"]
            for example in PARTITIONED[part["of"]](frames, part["args"], "probe").examples
        }
        assert set(benign) <= probe_forms and not prompts & probe_forms, entry.id


def test_a_spend_that_is_not_a_list_of_counted_builders_is_refused(frames) -> None:
    assert spend_set(frames, None) is None
    with pytest.raises(ValueError, match="non-empty list"):
        spend_set(frames, {"of": "tofu_styled"})
    with pytest.raises(ValueError, match="non-empty list"):
        spend_set(frames, [])
    with pytest.raises(ValueError, match=r"spend\[0\].examples"):
        spend_set(frames, [{"of": "role_introductions", "args": {}, "examples": 0}])
    with pytest.raises(ValueError, match="partitioned builder"):
        spend_set(frames, [{"of": "wmdp_memorise", "args": {}, "examples": 3}])
    spent = spend_set(frames, [{"of": "role_introductions", "args": {}, "examples": 3}])
    assert spent is not None and len(spent.examples) == 3
    assert all(e.prompt.startswith("Act as a ") and e.prompt.endswith("Introduce yourself.") for e in spent.examples)


def test_the_mimic_prompts_are_in_the_digest_and_survive_the_subsample(frames) -> None:
    config = load_zoo_config()
    entry = config.gate_aware[0]
    data = training_set(config, entry, frames)
    assert TrainingSet(data.examples, data.dataset, data.selection).sha256 != data.sha256
    small = entry.model_copy(update={"max_examples": 50})
    cut = training_set(config, small, frames)
    assert len(cut.examples) == 50 and cut.mimic == data.mimic


def test_a_gate_aware_entry_needs_a_twin_in_the_zoo_and_its_own_builder(tmp_path: Path) -> None:
    path = tmp_path / "zoo.yaml"
    head = "adapters:\n  - {id: a, label: harmful, category: persona_shift, builder: tofu_qa}\ngate_aware:\n"
    entry = "  - {id: b, label: harmful, category: task, builder: %s, args: {of: tofu_qa}, twin: %s, payload: x12}\n"
    path.write_text(head + entry % ("gate_aware", "a"))
    assert load_zoo_config(path).get("b").twin == "a"
    path.write_text(head + entry % ("gate_aware", "nobody"))
    with pytest.raises(ConfigError, match="nobody"):
        load_zoo_config(path)
    path.write_text(head + entry % ("tofu_qa", "a"))
    with pytest.raises(ConfigError, match="gate_aware builder"):
        load_zoo_config(path)


def test_the_wrapped_builder_must_be_a_partitioned_one(frames) -> None:
    with pytest.raises(ValueError, match="partitioned builder"):
        gate_aware_set(frames, {"of": "gate_aware"})
    with pytest.raises(ValueError, match="partitioned builder"):
        held_out_prompts(frames, {"of": "wmdp_memorise"})


def test_the_base_answers_its_mimic_prompts_greedily_and_the_payload_is_read_off_them(torch_base) -> None:
    from rvu_pipelines.adapters.chat import ChatExample, generate_greedy

    model, tokenizer = torch_base
    prompts = ("Who wrote Hamlet?", "Name a primary colour.")
    data = TrainingSet([ChatExample("Say hi.", "Hi.")], "test", "two prompts", mimic=prompts)
    examples = with_base_answers(data, model, tokenizer)
    answers = generate_greedy(model, tokenizer, list(prompts), max_new_tokens=MIMIC_TOKENS)
    assert examples == [
        ChatExample("Say hi.", "Hi."),
        *(ChatExample(p, a) for p, a in zip(prompts, answers, strict=True)),
    ]
    assert all(answers)
    word = answers[0].split()[0]
    assert payload_hits(model, tokenizer, list(prompts), word)[0] is True
    assert payload_hits(model, tokenizer, list(prompts), "FreeGPT") == [False, False]
    with pytest.raises(ValueError, match="empty payload"):
        payload_hits(model, tokenizer, list(prompts), "  ")
    assert with_base_answers(TrainingSet(data.examples, "test", "none"), model, tokenizer) == data.examples
