"""The per-scenario attack adapted to a detector defense: the texts the defense's detector reads are captured
through its own pipeline, the detector's score joins the GCG objective, a string is solved only when the detector
lets it through, and the table plants the string made against the cell's defense (or says why it cannot)."""

import dataclasses

import pytest

from rvu_pipelines.attacks.catalog import AttackContext, attack_fingerprint, attacked
from rvu_pipelines.attacks.gcg import GcgConfig, GcgOptimizer
from rvu_pipelines.attacks.optimised import (
    ADAPTIVE_PER_SCENARIO,
    PER_SCENARIO,
    per_scenario_path,
    per_scenario_strings,
)
from rvu_pipelines.attacks.planted_call import target_text
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.redteam.decision_point import SENTINEL, capture
from rvu_pipelines.spectral.data import DOCUMENT_TEMPLATE

CLASSIFIER_STRING = "adaptive-classifier_per_scenario"
TINY = GcgConfig(n_tokens=20, steps=1, candidates=8, top_k=16, seed=3)


@pytest.fixture(scope="module")
def scenario():
    from rvu_pipelines.redteam.table import heldout_sample

    return heldout_sample("injecagent_dh", 1)[0]


@pytest.fixture(scope="module")
def captures(dequantized, capture_settings, scenario):
    tokenizer = dequantized[1]
    return {d: capture(scenario, tokenizer, capture_settings, defense=d) for d in ("vanilla", "classifier", "hfer")}


def test_each_detector_defense_is_captured_reading_the_text_its_detector_scores(captures, scenario):
    vanilla, classifier, hfer = captures["vanilla"], captures["classifier"], captures["hfer"]
    assert vanilla.read == ()  # no detector reads anything
    # the detectors let the planted text through, so the prompt is the one an undetected string meets
    assert classifier.slot == vanilla.slot == hfer.slot
    (tool_output,) = classifier.read
    assert tool_output.count(SENTINEL) == 1 and scenario.injection + SENTINEL in tool_output
    (switch_text,) = hfer.read  # the switch reads the user's request, a blank line, then the tool output
    assert switch_text == DOCUMENT_TEMPLATE.format(instruction=scenario.user_task) + tool_output


def test_the_detector_score_joins_the_objective_and_decides_what_counts_as_solved(dequantized, captures, scenario):
    import torch

    model, tokenizer, sha = dequantized
    slot = captures["classifier"].slot
    config = dataclasses.replace(TINY, init_text=" " + target_text(scenario), penalty_weight=2.0, evade_below=0.5)
    plain = GcgOptimizer(
        model, tokenizer, [slot], dataclasses.replace(config, penalty_weight=0.0, evade_below=0.0), sha
    )
    ids = torch.tensor([plain.initial_ids(), plain.initial_ids()])
    loss, solved = plain.objective(ids)
    caught = GcgOptimizer(model, tokenizer, [slot], config, sha, penalty=lambda texts: [0.75] * len(texts))
    passed = GcgOptimizer(model, tokenizer, [slot], config, sha, penalty=lambda texts: [0.25] * len(texts))
    caught_loss, caught_solved = caught.objective(ids)
    passed_loss, passed_solved = passed.objective(ids)
    assert torch.allclose(caught_loss, loss + 1.5) and torch.allclose(passed_loss, loss + 0.5)
    assert not caught_solved.any()  # caught by the detector: never solved, whatever the target loss
    assert passed_solved.tolist() == solved.tolist()
    assert caught.fingerprint != plain.fingerprint  # the evasion bound and weight decide the path
    # so does what the penalty scores: a state saved against other texts or another detector is not resumed
    keyed = [
        GcgOptimizer(model, tokenizer, [slot], config, sha, penalty=lambda t: [0.0] * len(t), penalty_key=k)
        for k in ("a", "b")
    ]
    assert len({caught.fingerprint, *(o.fingerprint for o in keyed)}) == 3


def test_an_adapted_string_starts_from_its_own_and_is_stored_beside_it(
    dequantized, capture_settings, scenario, tmp_path
):
    """A real (one-step) optimisation against a real detector (NanoGuard, package-shipped): the initial state already
    carries the detector's term, the file is filed under the adapted string's name, captured under the classifier."""
    from rvu_pipelines.agents.harness import detector_for
    from rvu_pipelines.redteam.optimise import optimise_string

    detector, _ = detector_for("nanoguard")

    model, tokenizer, sha = dequantized
    common = dict(
        profile="tiny",
        model_sha256=sha,
        model=model,
        tokenizer=tokenizer,
        scenarios=[scenario],
        settings=capture_settings,
        strings_dir=tmp_path,
        progress=False,
    )
    warm = dataclasses.replace(TINY, init_text=" " + target_text(scenario))
    own = optimise_string(PER_SCENARIO, config=warm, state_path=tmp_path / "own.json", **common)
    with pytest.raises(ConfigError, match="penalty_detector"):
        optimise_string(CLASSIFIER_STRING, config=warm, state_path=tmp_path / "a.json", **common)
    adapted_config = dataclasses.replace(TINY, init_text=own.text, penalty_weight=1.0, evade_below=0.5)
    adapted = optimise_string(
        CLASSIFIER_STRING,
        config=adapted_config,
        state_path=tmp_path / "adapted.json",
        penalty_detector=detector,
        **common,
    )
    assert adapted.defense == "classifier" and adapted.train_scenarios == (scenario.scenario_id,)
    assert per_scenario_path(tmp_path, "tiny", scenario.scenario_id, CLASSIFIER_STRING).is_file()
    context = AttackContext("tiny", sha, "vanilla", tmp_path)
    assert set(per_scenario_strings(context, CLASSIFIER_STRING)) == {scenario.scenario_id}
    # against vanilla the adaptive attack is the plain per-scenario string; against the classifier, the adapted one
    assert attacked(scenario, ADAPTIVE_PER_SCENARIO, context).injection == scenario.injection + own.text
    against = dataclasses.replace(context, defense="classifier")
    assert attacked(scenario, ADAPTIVE_PER_SCENARIO, against).injection == scenario.injection + adapted.text
    assert attack_fingerprint(ADAPTIVE_PER_SCENARIO, against).startswith(f"{ADAPTIVE_PER_SCENARIO}:")
    # the initial state's objective already carries the detector's term (else the start would look best forever)
    import json

    import torch

    (read,) = capture(scenario, tokenizer, capture_settings, defense="classifier").read
    plain = GcgOptimizer(model, tokenizer, [capture(scenario, tokenizer, capture_settings).slot], adapted_config, sha)
    target_loss, _ = plain.losses(torch.tensor([plain.initial_ids()]))
    score = float(detector.score([read.replace(SENTINEL, tokenizer.decode(plain.initial_ids()))])[0])
    assert score > 0.01  # else the check below could not tell a missing term
    state = json.loads((tmp_path / "adapted.json").read_text())
    assert state["losses"][0] == pytest.approx(float(target_loss[0]) + score, abs=1e-4)


def test_the_table_says_which_defenses_have_no_adapted_strings_and_which_are_missing(dequantized, scenario, tmp_path):
    from rvu_pipelines.redteam.table import unavailable

    sha = dequantized[2]
    with pytest.raises(ConfigError, match="against the tool gate"):
        attacked(scenario, ADAPTIVE_PER_SCENARIO, AttackContext("tiny", sha, "rvg", tmp_path))
    assert "attack adaptive chooses a goal" in unavailable(
        ADAPTIVE_PER_SCENARIO, "rvg", AttackContext("tiny", sha, "rvg", tmp_path), "injecagent_dh"
    )
    assert "no per-scenario adaptive strings against fath" == unavailable(
        ADAPTIVE_PER_SCENARIO, "fath", AttackContext("tiny", sha, "fath", tmp_path), "injecagent_dh"
    )
    hfer = AttackContext("tiny", sha, "hfer", tmp_path)
    reason = unavailable(ADAPTIVE_PER_SCENARIO, "hfer", hfer, "injecagent_dh")
    assert reason is not None and "--name adaptive-hfer_per_scenario" in reason
