"""GCG on the agent's own weights: the slot is the agent's real prompt, a step lowers the loss it reports, the state
resumes after SIGKILL exactly where it stopped, and a stored string is refused for other weights."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rvu_pipelines.attacks.gcg import GcgConfig, GcgOptimizer
from rvu_pipelines.attacks.planted_call import target_text
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.redteam.decision_point import SENTINEL, capture

TINY = GcgConfig(n_tokens=4, steps=2, candidates=8, top_k=16, seed=3)


def test_the_slot_is_the_agents_prompt_cut_at_the_injection(dequantized, capture_settings, train_scenario):
    model, tokenizer, _ = dequantized
    slot = capture(train_scenario, tokenizer, capture_settings).slot
    assert slot is not None and slot.slot_id == train_scenario.scenario_id
    before, after = tokenizer.decode(list(slot.prefix_ids)), tokenizer.decode(list(slot.suffix_ids))
    assert before.endswith(train_scenario.injection)  # the string acts right after the native injection
    assert "<|im_start|>system" in before and after.rstrip().endswith("<|im_start|>assistant")
    assert SENTINEL not in before + after
    target = tokenizer.decode(list(slot.target_ids))
    assert target == target_text(train_scenario) and train_scenario.attacker_tools[0] in target


def test_a_bipia_slot_targets_the_answer_its_judge_counts(dequantized, capture_settings):
    """BIPIA is judged on the answer: the slot ends where the agent starts answering, and its target is that answer."""
    from rvu_pipelines.scenarios import scenarios_for

    tokenizer = dequantized[1]
    scenario = scenarios_for("bipia_email", 1)[0]
    slot = capture(scenario, tokenizer, capture_settings).slot
    assert tokenizer.decode(list(slot.suffix_ids)).rstrip().endswith("<|im_start|>assistant")
    assert tokenizer.decode(list(slot.target_ids)) == target_text(scenario) == scenario.attack_goal
    assert scenario.judge(target_text(scenario))[0]


def test_a_step_keeps_the_best_string_and_its_reported_loss_is_the_real_one(
    dequantized, capture_settings, train_scenario, tmp_path
):
    import torch

    model, tokenizer, sha = dequantized
    slot = capture(train_scenario, tokenizer, capture_settings).slot
    optimizer = GcgOptimizer(model, tokenizer, [slot], TINY, sha)
    state = optimizer.run(tmp_path / "state.json", progress=False, stop_when_solved=False)
    assert state.step == 2 and len(state.losses) == 3
    assert state.best_loss <= state.losses[0]
    recomputed, _ = optimizer.losses(torch.tensor([state.best_ids]))
    assert float(recomputed[0]) == pytest.approx(state.best_loss, abs=1e-4)
    assert all(t in set(optimizer.allowed.tolist()) for t in state.best_ids)  # plantable tokens only
    stored = json.loads((tmp_path / "state.json").read_text())
    assert stored["step"] == 2 and stored["fingerprint"] == optimizer.fingerprint


def _optimise_command(tmp_path: Path, steps: int) -> list[str]:
    return [
        sys.executable,
        "scripts/optimise_attack.py",
        "--train",
        "1",
        "--steps",
        str(steps),
        "--candidates",
        "8",
        "--top-k",
        "16",
        "--tokens",
        "4",
        "--seed",
        "3",
        "--strings-dir",
        str(tmp_path / "strings"),
        "--state-dir",
        str(tmp_path / "state"),
    ]


@pytest.mark.slow
def test_an_optimisation_killed_with_sigkill_resumes_from_its_last_step(tmp_path):
    """Killed mid-run, the same command continues from the saved step and ends where an uninterrupted run ends."""
    root = Path(__file__).resolve().parents[2]
    state = tmp_path / "state" / "gcg_universal_tiny.json"
    process = subprocess.Popen(_optimise_command(tmp_path, 4), cwd=root, env=os.environ.copy())
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        if state.is_file() and json.loads(state.read_text())["step"] >= 1:
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = json.loads(state.read_text())["step"]
    assert 1 <= killed_at < 4
    subprocess.run(_optimise_command(tmp_path, 4), cwd=root, env=os.environ.copy(), check=True)
    resumed = json.loads(state.read_text())
    assert resumed["step"] == 4 and len(resumed["losses"]) == 5
    fresh = tmp_path / "fresh"
    subprocess.run(_optimise_command(fresh, 4), cwd=root, env=os.environ.copy(), check=True)
    uninterrupted = json.loads((fresh / "state" / "gcg_universal_tiny.json").read_text())
    assert resumed["best_ids"] == uninterrupted["best_ids"]
    assert resumed["losses"] == pytest.approx(uninterrupted["losses"], abs=1e-4)


@pytest.fixture(scope="module")
def optimised(dequantized, capture_settings, train_scenario, tmp_path_factory):
    """A real (tiny) universal optimisation stored where a harness reads it, with its random control."""
    folder = tmp_path_factory.mktemp("strings")
    return folder, _optimise_tiny("gcg_universal", dequantized, capture_settings, train_scenario, folder, TINY)


def _optimise_tiny(name, dequantized, settings, scenario, folder, config, **extra):
    """The string ``name`` optimised on ``scenario`` alone for the tiny profile, stored with its state in ``folder``
    (``extra``: e.g. the penalty detector of a string adapted to one)."""
    from rvu_pipelines.redteam.optimise import optimise_string

    model, tokenizer, sha = dequantized
    return optimise_string(
        name,
        profile="tiny",
        model_sha256=sha,
        model=model,
        tokenizer=tokenizer,
        scenarios=[scenario],
        settings=settings,
        config=config,
        state_path=folder / "state.json",
        strings_dir=folder,
        progress=False,
        **extra,
    )


def test_the_stored_string_names_its_weights_and_training_and_its_control_sits_beside_it(optimised, train_scenario):
    from rvu_pipelines.attacks.stored import load_string

    folder, stored = optimised
    assert stored.train_scenarios == (train_scenario.scenario_id,) and stored.steps == 2
    assert stored.text and len(stored.token_ids) == TINY.n_tokens
    control = load_string(folder / "random_string_tiny.json", stored.model_sha256)
    assert len(control.token_ids) == len(stored.token_ids) and control.text != stored.text
    assert control.steps == 0 and control.loss > 0  # its real loss on the training prompts, beside the string's
    with pytest.raises(ConfigError, match="does not carry over between weights"):
        load_string(folder / "gcg_universal_tiny.json", "0" * 64)


def test_a_training_scenario_is_never_evaluated_under_its_string(optimised, train_scenario, tiny_models):
    from rvu_pipelines.attacks.catalog import AttackContext, attacked

    folder, stored = optimised
    context = AttackContext("tiny", stored.model_sha256, "vanilla", folder)
    with pytest.raises(ConfigError, match="held-out"):
        attacked(train_scenario, "gcg_universal", context)


def test_the_real_agent_runs_a_held_out_episode_under_the_optimised_string(optimised, string_harness):
    """ASR is measured by the agent on llama.cpp (the quantised GGUF): the row records the attack, the agent read
    the string in the tool's output, and the episode key differs from the native one of the same scenario."""
    from rvu_pipelines.attacks.optimised import in_training_split
    from rvu_pipelines.scenarios import scenarios_for

    folder, stored = optimised
    held_out = next(s for s in scenarios_for("injecagent_dh", 20) if not in_training_split(s.scenario_id))
    harness = string_harness(folder)
    attacked_run = harness.run_cell("injecagent_dh", "vanilla", attack="gcg_universal", scenarios=[held_out])
    native_run = harness.run_cell("injecagent_dh", "vanilla", scenarios=[held_out])
    row = attacked_run.rows.row(0, named=True)
    assert row["attack"] == "gcg_universal" and row["error"] is None
    assert isinstance(row["attack_succeeded"], bool)
    assert row["episode_key"] != native_run.rows.row(0, named=True)["episode_key"]
    assert attacked_run.path != native_run.path


def test_the_universal_string_on_the_planted_call_is_optimised_and_planted_after_the_goal(
    dequantized, capture_settings, train_scenario, tmp_path
):
    """``gcg_universal_call`` meets the prompt with the attacker's goal already written out, optimises one string
    after it, and plants that string after the goal in held-out scenarios; ``planted_call`` is its paired control."""
    import dataclasses

    import torch

    from rvu_pipelines.attacks.catalog import AttackContext, attacked
    from rvu_pipelines.attacks.optimised import UNIVERSAL_CALL, in_training_split, slot_scenario
    from rvu_pipelines.redteam.table import CONTROLS
    from rvu_pipelines.scenarios import scenarios_for

    model, tokenizer, sha = dequantized
    planted = slot_scenario(UNIVERSAL_CALL, train_scenario)
    assert planted.injection == f"{train_scenario.injection} {target_text(train_scenario)}"
    slot = capture(planted, tokenizer, capture_settings).slot
    assert tokenizer.decode(list(slot.prefix_ids)).endswith(target_text(train_scenario))
    stored = _optimise_tiny(
        UNIVERSAL_CALL, dequantized, capture_settings, train_scenario, tmp_path, dataclasses.replace(TINY, steps=1)
    )
    assert stored.name == UNIVERSAL_CALL and stored.train_scenarios == (train_scenario.scenario_id,)
    # its first loss is the string's on the prompt with the goal planted, not on the native one
    state = json.loads((tmp_path / "state.json").read_text())
    native_slot = capture(train_scenario, tokenizer, capture_settings).slot
    plain, _ = GcgOptimizer(model, tokenizer, [native_slot], TINY, sha).losses(torch.tensor([state["best_ids"]]))
    assert stored.loss < float(plain[0])
    held_out = next(s for s in scenarios_for("injecagent_dh", 20) if not in_training_split(s.scenario_id))
    rewritten = attacked(held_out, UNIVERSAL_CALL, AttackContext("tiny", sha, "vanilla", tmp_path))
    assert rewritten.injection == f"{held_out.injection} {target_text(held_out)}{stored.text}"
    assert CONTROLS[UNIVERSAL_CALL] == "planted_call"
    with pytest.raises(ConfigError, match="held-out"):
        attacked(train_scenario, UNIVERSAL_CALL, AttackContext("tiny", sha, "vanilla", tmp_path))


def test_a_universal_strings_pytorch_outcomes_are_the_optimisers_and_feed_the_transfer_table(
    dequantized, capture_settings, train_scenario, tmp_path
):
    """The held-out check scores a stored string as the optimiser does; its file is kept for that string and
    weights only, and the study's transfer cells read it for the string's undefended cell."""
    import dataclasses

    import torch

    from rvu_pipelines.attacks.catalog import AttackContext
    from rvu_pipelines.attacks.gcg import target_outcome
    from rvu_pipelines.attacks.optimised import UNIVERSAL_CALL, slot_scenario
    from rvu_pipelines.attacks.stored import load_string, save_string, string_path
    from rvu_pipelines.paths import config_dir
    from rvu_pipelines.redteam.table import TablePlan, heldout_sample, per_scenario_cells
    from rvu_pipelines.redteam.transfer import load_outcomes, pytorch_outcomes, save_outcomes, transfer_path

    model, tokenizer, sha = dequantized
    stored = load_string(string_path(config_dir() / "attacks", UNIVERSAL_CALL, "tiny"), sha)  # the committed one
    held_out = heldout_sample("injecagent_dh", 2)
    slot = capture(slot_scenario(UNIVERSAL_CALL, held_out[0]), tokenizer, capture_settings).slot
    loss, greedy = target_outcome(model, slot, stored.token_ids)
    reference, exact = GcgOptimizer(model, tokenizer, [slot], TINY, sha).losses(torch.tensor([stored.token_ids]))
    assert loss == pytest.approx(float(reference[0]), abs=1e-4) and greedy == bool(exact[0])
    outcomes = pytorch_outcomes(stored, held_out, model, tokenizer, capture_settings, progress=False)
    assert [o.scenario_id for o in outcomes] == [s.scenario_id for s in held_out]
    assert outcomes[0].loss == pytest.approx(loss, abs=1e-5) and outcomes[0].solved == greedy
    trained = dataclasses.replace(stored, train_scenarios=(train_scenario.scenario_id,))
    with pytest.raises(ConfigError, match="held-out"):
        pytorch_outcomes(trained, [train_scenario], model, tokenizer, capture_settings, progress=False)
    folder = tmp_path / "transfer"
    path = save_outcomes(transfer_path(folder, UNIVERSAL_CALL, "tiny"), stored, outcomes)
    assert load_outcomes(path, stored) == {o.scenario_id: o for o in outcomes}
    assert load_outcomes(path, dataclasses.replace(stored, text=stored.text + "!")) is None  # another string
    document = json.loads(path.read_text())
    other_plant = path.with_name("other-plant.json")
    other_plant.write_text(json.dumps({**document, "plant": "tool-call-v2"}))  # the goal written out another way
    assert load_outcomes(other_plant, stored) is None
    strings = tmp_path / "strings"
    save_string(string_path(strings, UNIVERSAL_CALL, "tiny"), stored)
    plan = TablePlan(("injecagent_dh",), ("planted_call", UNIVERSAL_CALL), ("vanilla", "rvg"), 2)
    context_of = lambda defense: AttackContext("tiny", sha, defense, strings)  # noqa: E731
    cells = per_scenario_cells(plan, context_of, folder)
    assert list(cells) == [(UNIVERSAL_CALL, "vanilla")] and cells[(UNIVERSAL_CALL, "vanilla")] == load_outcomes(
        path, stored
    )
    assert per_scenario_cells(plan, context_of) == {}  # no transfer folder: nothing to cross


def test_the_adaptive_call_string_starts_from_the_universal_call_one_and_meets_each_defense_with_its_own(
    dequantized, capture_settings, train_scenario, tmp_path
):
    """``adaptive-classifier_call`` starts from the stored ``gcg_universal_call`` string, is captured under the
    classifier with its detector's score in the objective, and follows the planted goal; ``adaptive_call`` plants it
    against the classifier, the universal-call string against the undefended agent (its control), and names what it
    lacks."""
    import dataclasses
    import shutil

    from rvu_pipelines.agents.harness import detector_for
    from rvu_pipelines.attacks.catalog import AttackContext, attacked
    from rvu_pipelines.attacks.gcg import target_outcome
    from rvu_pipelines.attacks.optimised import (
        ADAPTIVE_CALL,
        ADAPTIVE_CLASSIFIER_CALL,
        UNIVERSAL_CALL,
        in_training_split,
        slot_scenario,
    )
    from rvu_pipelines.attacks.stored import load_string, string_path
    from rvu_pipelines.paths import config_dir
    from rvu_pipelines.redteam.optimise import detector_penalty, warm_start
    from rvu_pipelines.redteam.table import CONTROLS, unavailable
    from rvu_pipelines.scenarios import scenarios_for

    detector, _ = detector_for("nanoguard")  # a real detector (package-shipped) in place of the production one
    model, tokenizer, sha = dequantized
    strings = tmp_path / "strings"
    strings.mkdir()
    committed = string_path(config_dir() / "attacks", UNIVERSAL_CALL, "tiny")
    shutil.copy(committed, string_path(strings, UNIVERSAL_CALL, "tiny"))
    universal = load_string(committed, sha)
    config = warm_start(
        ADAPTIVE_CLASSIFIER_CALL,
        dataclasses.replace(TINY, steps=1, penalty_weight=1.0),
        strings_dir=strings,
        profile="tiny",
        model_sha256=sha,
        tokenizer=tokenizer,
    )
    assert config.init_text == universal.text and config.n_tokens == len(universal.token_ids)
    assert (
        warm_start(UNIVERSAL_CALL, TINY, strings_dir=strings, profile="tiny", model_sha256=sha, tokenizer=tokenizer)
        == TINY
    )
    with pytest.raises(ConfigError, match="penalty_detector"):  # adapted to a detector: its score is in the objective
        _optimise_tiny(ADAPTIVE_CLASSIFIER_CALL, dequantized, capture_settings, train_scenario, tmp_path, config)
    adapted = _optimise_tiny(
        ADAPTIVE_CLASSIFIER_CALL,
        dequantized,
        capture_settings,
        train_scenario,
        strings,
        config,
        penalty_detector=detector,
    )
    captured = capture(
        slot_scenario(ADAPTIVE_CLASSIFIER_CALL, train_scenario), tokenizer, capture_settings, defense="classifier"
    )
    slot = captured.slot
    assert tokenizer.decode(list(slot.prefix_ids)).endswith(target_text(train_scenario))  # after the planted goal
    assert GcgOptimizer(model, tokenizer, [slot], config, sha).initial_ids() == list(universal.token_ids)
    # its first loss is the universal-call string's call loss plus the detector's score of the text it reads
    penalty = detector_penalty(detector, captured.read)([universal.text])[0]
    call_loss, _ = target_outcome(model, captured.slot, universal.token_ids)
    assert penalty > 0.0
    state = json.loads((strings / "state.json").read_text())
    assert state["losses"][0] == pytest.approx(call_loss + penalty, abs=1e-4)
    assert adapted.loss == pytest.approx(state["best_loss"], abs=1e-5) and adapted.steps == state["step"]
    assert adapted.defense == "classifier" and "detector score" in adapted.objective
    assert len(adapted.token_ids) == len(universal.token_ids)
    held_out = next(s for s in scenarios_for("injecagent_dh", 20) if not in_training_split(s.scenario_id))
    goal = f"{held_out.injection} {target_text(held_out)}"
    against = {
        d: attacked(held_out, ADAPTIVE_CALL, AttackContext("tiny", sha, d, strings)) for d in ("classifier", "vanilla")
    }
    assert against["classifier"].injection == goal + adapted.text
    assert against["vanilla"].injection == goal + universal.text
    assert CONTROLS[ADAPTIVE_CALL] == UNIVERSAL_CALL  # what knowing the defense adds
    with pytest.raises(ConfigError, match="No adaptive_call string against defense 'hfer'"):
        attacked(held_out, ADAPTIVE_CALL, AttackContext("tiny", sha, "hfer", strings))
    assert unavailable(ADAPTIVE_CALL, "hfer", AttackContext("tiny", sha, "hfer", strings)) is not None
    assert unavailable(ADAPTIVE_CALL, "classifier", AttackContext("tiny", sha, "classifier", strings)) is None
    empty = AttackContext("tiny", sha, "classifier", tmp_path / "none")
    assert ADAPTIVE_CLASSIFIER_CALL in unavailable(ADAPTIVE_CALL, "classifier", empty)


def test_the_mixed_universal_string_trains_on_both_injecagent_splits_and_follows_the_planted_goal(tmp_path):
    """``gcg_universal_call_mixed`` draws its training scenarios from the training splits of dh and ds alike (never
    the canonical 10, never a held-out one), starts from the ``gcg_universal_call`` string and is planted after the
    goal like it; the dh-only string keeps its dh-only split."""
    from rvu_pipelines.attacks.optimised import (
        TRAIN_BENCHMARK,
        UNIVERSAL_CALL,
        UNIVERSAL_CALL_MIXED,
        WARM_STARTS,
        in_training_split,
        plant_of,
        universal_training_scenarios,
    )
    from rvu_pipelines.redteam.table import CONTROLS, heldout_sample
    from rvu_pipelines.scenarios.registry import canonical_scenarios

    canonical = frozenset(s.scenario_id for s in canonical_scenarios())
    mixed = universal_training_scenarios(UNIVERSAL_CALL_MIXED, 3, exclude=canonical)
    assert [s.benchmark for s in mixed] == ["injecagent_dh"] * 3 + ["injecagent_ds"] * 3
    assert all(in_training_split(s.scenario_id) and s.scenario_id not in canonical for s in mixed)
    held_out = {s.scenario_id for b in ("injecagent_dh", "injecagent_ds") for s in heldout_sample(b, 100)}
    assert held_out.isdisjoint(s.scenario_id for s in mixed)
    alone = universal_training_scenarios(UNIVERSAL_CALL, 3, exclude=canonical)
    assert {s.benchmark for s in alone} == {TRAIN_BENCHMARK} and alone == mixed[:3]
    assert WARM_STARTS[UNIVERSAL_CALL_MIXED] == UNIVERSAL_CALL and plant_of(UNIVERSAL_CALL_MIXED) == plant_of(
        UNIVERSAL_CALL
    )
    assert CONTROLS[UNIVERSAL_CALL_MIXED] == UNIVERSAL_CALL  # what training on ds too adds


def test_a_staged_string_meets_the_send_after_the_extractions_result(dequantized, capture_settings, tmp_path):
    """``gcg_universal_call_staged`` is optimised at each decision point of a data-stealing goal: the extraction right
    after the injection is read, and the send in the prompt the agent meets once the extraction (answered with the
    goal's own call) has returned the stolen data; the string sits at the same place in both. Its loss is the mean
    over both slots, and the scenario is named once among those it trained on."""
    import dataclasses

    import torch

    from rvu_pipelines.attacks.optimised import (
        UNIVERSAL_CALL,
        UNIVERSAL_CALL_MIXED,
        UNIVERSAL_CALL_STAGED,
        WARM_STARTS,
        decision_stages,
        slot_scenario,
        universal_training_scenarios,
    )
    from rvu_pipelines.attacks.planted_call import goal_calls
    from rvu_pipelines.redteam.table import CONTROLS
    from rvu_pipelines.scenarios.registry import canonical_scenarios

    model, tokenizer, sha = dequantized
    canonical = frozenset(s.scenario_id for s in canonical_scenarios())
    dh, ds = universal_training_scenarios(UNIVERSAL_CALL_STAGED, 1, exclude=canonical)
    assert (dh.benchmark, ds.benchmark) == ("injecagent_dh", "injecagent_ds")
    assert [s.scenario_id for s in universal_training_scenarios(UNIVERSAL_CALL_MIXED, 1, exclude=canonical)] == [
        dh.scenario_id,
        ds.scenario_id,
    ]
    assert decision_stages(UNIVERSAL_CALL_STAGED, dh) == [((), json.dumps({"tool": dh.attacker_tools[0]}))]
    assert decision_stages(UNIVERSAL_CALL_MIXED, ds) == [((), None)]  # the first call alone
    extract, send = goal_calls(ds)
    assert decision_stages(UNIVERSAL_CALL_STAGED, ds) == [((), extract), ((extract,), send)]
    planted = slot_scenario(UNIVERSAL_CALL_STAGED, ds)
    first, second = (
        capture(planted, tokenizer, capture_settings, target=target, answers=answers).slot
        for answers, target in decision_stages(UNIVERSAL_CALL_STAGED, planted)
    )
    assert (first.slot_id, second.slot_id) == (ds.scenario_id, f"{ds.scenario_id}#2")
    assert first.prefix_ids == second.prefix_ids  # the string acts at the same place
    after = tokenizer.decode(list(second.suffix_ids))
    assert after.startswith(tokenizer.decode(list(first.suffix_ids))) and after.rstrip().endswith("assistant")
    assert extract in after and "private" in after.split(extract, 1)[1]  # the call, then the stolen data
    assert tokenizer.decode(list(first.target_ids)) == extract and tokenizer.decode(list(second.target_ids)) == send
    stored = _optimise_tiny(
        UNIVERSAL_CALL_STAGED, dequantized, capture_settings, ds, tmp_path, dataclasses.replace(TINY, steps=1)
    )
    assert stored.train_scenarios == (ds.scenario_id,)
    ids = torch.tensor([list(stored.token_ids)])
    both, _ = GcgOptimizer(model, tokenizer, [first, second], TINY, sha).losses(ids)
    alone, _ = GcgOptimizer(model, tokenizer, [first], TINY, sha).losses(ids)
    assert stored.loss == pytest.approx(float(both[0]), abs=1e-4)  # the mean over both decision points
    assert abs(float(both[0]) - float(alone[0])) > 1e-3  # the send's term counts
    assert WARM_STARTS[UNIVERSAL_CALL_STAGED] == UNIVERSAL_CALL and CONTROLS[UNIVERSAL_CALL_STAGED] == UNIVERSAL_CALL
