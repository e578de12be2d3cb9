"""The registered optimised attacks read committed strings: unknown names and missing or foreign strings are refused
with what to do, and the adaptive attack exists only for the defenses it was made against."""

import json

import pytest

from rvu_pipelines.attacks.catalog import AttackContext, attack_fingerprint, get_attack, registered
from rvu_pipelines.attacks.optimised import adaptive_name, in_training_split, training_scenarios
from rvu_pipelines.attacks.stored import StoredString, load_string, save_string, string_path
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.axes import ATTACKS

SHA = "a" * 64


def _stored(name: str = "gcg_universal") -> StoredString:
    return StoredString(
        name=name,
        profile="tiny",
        model_sha256=SHA,
        text=" zx!",
        token_ids=(1, 2),
        objective="test",
        defense="vanilla",
        train_scenarios=("injecagent/dh/1",),
        steps=3,
        loss=0.5,
        solved=False,
        cpu_minutes=0.1,
    )


def test_every_axis_attack_is_registered_and_an_unknown_one_is_refused_naming_the_field():
    assert tuple(registered()) == tuple(sorted(ATTACKS))
    with pytest.raises(ConfigError, match=r"Unknown attack 'gcg'; allowed values: no_attack, native"):
        get_attack("gcg")


def test_a_stored_string_round_trips_and_bad_files_say_how_to_fix_them(tmp_path):
    path = save_string(string_path(tmp_path, "gcg_universal", "tiny"), _stored())
    assert load_string(path, SHA) == _stored()
    with pytest.raises(ConfigError, match="does not carry over"):
        load_string(path, "b" * 64)
    with pytest.raises(ConfigError, match="make attacks"):
        load_string(tmp_path / "missing.json", SHA)
    raw = json.loads(path.read_text())
    del raw["text"]
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="missing field"):
        load_string(path, SHA)
    path.write_text(json.dumps({**raw, "text": "x", "surprise": 1}))
    with pytest.raises(ConfigError, match="unknown field"):
        load_string(path, SHA)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_string(path, SHA)


def test_the_fingerprint_follows_the_stored_text(tmp_path):
    context = AttackContext("tiny", SHA, "vanilla", tmp_path)
    save_string(string_path(tmp_path, "gcg_universal", "tiny"), _stored())
    first = attack_fingerprint("gcg_universal", context)
    save_string(string_path(tmp_path, "gcg_universal", "tiny"), StoredString(**{**_stored().__dict__, "text": " q"}))
    assert attack_fingerprint("gcg_universal", context) != first
    assert attack_fingerprint("native", context) == ""


def test_adaptive_exists_only_where_an_attack_was_made_against_the_defense():
    assert adaptive_name("vanilla") == "gcg_universal"
    assert adaptive_name("classifier") == "adaptive-classifier"
    with pytest.raises(ConfigError, match="No adaptive attack against defense 'hfer'"):
        adaptive_name("hfer")
    with pytest.raises(ConfigError, match="against 'rvg' chooses a goal the gate allows"):
        adaptive_name("rvg")


def test_the_training_split_is_fixed_excludes_what_is_asked_and_spreads_over_goals():
    from rvu_pipelines.scenarios import scenarios_for

    dh = scenarios_for("injecagent_dh", None)
    split = [s for s in dh if in_training_split(s.scenario_id)]
    assert 0 < len(split) < len(dh) / 10
    chosen = training_scenarios(dh, 4, exclude=frozenset({split[0].scenario_id}))
    assert split[0] not in chosen and all(in_training_split(s.scenario_id) for s in chosen)
    assert len({s.attacker_tools[0] for s in chosen}) == 4  # one per attacker goal
    with pytest.raises(ConfigError, match="training split"):
        training_scenarios(dh[:3], 3)


def test_no_attack_removes_the_injection():
    from rvu_pipelines.attacks.catalog import attacked
    from rvu_pipelines.scenarios import scenarios_for

    scenario = scenarios_for("injecagent_dh", 1)[0]
    cleaned = attacked(scenario, "no_attack", AttackContext("tiny", SHA, "vanilla", ".")).injection
    assert cleaned == "" and scenario.injection
