"""``hfer`` as a Table 1 defense: settings and pipeline load nothing until an hfer episode scores a tool output,
the benchmark's pre-filled call is handled as ``classifier`` handles it, an abort is a ``defense_abort`` record
in the incident log that ``rvu recover`` reads, and the switch's version keys the hfer cells (only them).

The real switch runs on SmolLM2's own weights with a small calibration (8 examples, layers 2-3: tens of
seconds of CPU with the weights load); the Table 1 default (20 examples, every layer) takes minutes and runs in
``rvu regress``, not here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_defenses import KEY, _validate_jsonl

from rvu_pipelines.agents.defenses import DefenseSettings, PrefilledToolCalls, build_pipeline
from rvu_pipelines.agents.defenses.hfer import ABORT_PREFIX, SpectralKillSwitch
from rvu_pipelines.agents.episode import run_episode
from rvu_pipelines.agents.harness import Harness
from rvu_pipelines.detectors.heuristic import HeuristicDetector
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.axes import CANONICAL
from rvu_pipelines.scenarios.contract import prefill_calls
from rvu_pipelines.spectral.agent_switch import LazyHferDetector, calibrated_switch
from rvu_pipelines.spectral.graph import STAT_NAMES

SCENARIO = "injecagent/dh/33"  # canonical; InjecAgent's protocol pre-fills the call whose output is injected


class CountingChatModel:
    """The real model, counting its calls (an aborted episode must make none after the tool output)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls = 0

    def chat(self, messages, **kwargs):
        self.calls += 1
        return self.inner.chat(messages, **kwargs)


@pytest.fixture(scope="module")
def scenario(shared_data):
    from rvu_pipelines.scenarios.registry import scenario_by_id

    return scenario_by_id(SCENARIO)


@pytest.fixture(scope="module")
def small_switch(tiny_models, tmp_path_factory) -> LazyHferDetector:
    """The real switch on the tiny profile's weights, calibrated on 8 examples of the contamination sets'
    calibration split, layers 2-3 (calibrated on first use, kept in a temporary store)."""
    return LazyHferDetector.for_profile(
        "tiny",
        expected_sha256=tiny_models["llm"].sha256,
        store=tmp_path_factory.mktemp("switches"),
        size=8,
        layers=(2, 3),
        benign_size=20,
    )


def _settings(tmp_path: Path, **overrides) -> DefenseSettings:
    values = dict(fath_key=KEY, max_iters=1, max_tokens=16, signing_key_dir=tmp_path / "keys")
    values.update(overrides)
    return DefenseSettings(**values)


def test_settings_pipeline_and_harness_load_nothing(scenario, smollm, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    detector = settings.hfer_detector
    assert isinstance(detector, LazyHferDetector) and repr(detector) == "LazyHferDetector(profile (default))"
    hfer = build_pipeline("hfer", smollm, scenario, settings)
    classifier = build_pipeline("classifier", smollm, scenario, settings)
    # the pre-filled first call, as the classifier branch handles it
    assert [type(e).__name__ for e in hfer.elements[:3]] == ["SystemMessage", "InitQuery", "PrefilledToolCalls"]
    assert [type(e) for e in hfer.elements[:3]] == [type(e) for e in classifier.elements[:3]]
    first = hfer.elements[2]
    assert isinstance(first, PrefilledToolCalls) and first.calls == list(prefill_calls(scenario))
    loop = hfer.elements[3]
    assert [type(e).__name__ for e in loop.elements] == ["ToolsExecutor", "SpectralKillSwitch", "ChatModelLLM"]
    switch = loop.elements[1]
    assert isinstance(switch, SpectralKillSwitch) and switch.detector is detector and switch.trace is hfer.trace
    assert switch.threshold == settings.hfer_threshold == 0.5 and hfer.defense == "hfer"
    assert loop.max_iters == settings.max_iters
    assert not detector.loaded and detector._spec is None  # not even the profile was resolved

    harness = Harness.open(
        (lambda: smollm, smollm.name),
        profile="tiny",
        model_id="0" * 64,
        detector="heuristic",
        root=tmp_path / "attacks",
        cache_path=tmp_path / "llm_cache.sqlite",
    )
    assert isinstance(harness.settings.hfer_detector, LazyHferDetector)
    for defense in ("vanilla", "classifier", "rvu_v2"):
        harness.settings_fingerprint(defense)
    assert harness.settings.hfer_detector._spec is None and not harness.settings.hfer_detector.loaded
    # the switch must read the agent's own weights: a profile resolving to others is refused when hfer runs
    with pytest.raises(ConfigError, match="agent's own weights"):
        harness.settings_fingerprint("hfer")


def test_a_stopped_episode_is_a_defense_abort_record_that_recover_reads(scenario, smollm, tmp_path: Path) -> None:
    """The real D1 heuristic inside the kill switch at threshold 0 fires on the first tool output, always."""
    llm = CountingChatModel(smollm)
    settings = _settings(tmp_path, hfer_detector=HeuristicDetector(), hfer_threshold=0.0)
    row = run_episode(scenario, "hfer", llm, settings, tmp_path / "episode").to_row()
    assert row["error"] is None, row["error"]
    assert row["aborted"].startswith(ABORT_PREFIX) and "message 3" in row["aborted"]
    assert llm.calls == 0  # stopped before generation: the model never read the output
    assert row["steps"] == 1 and row["tool_calls"] == 1  # the pre-filled turn only; the abort turn is no step
    assert not row["attack_succeeded"] and row["flagged_outputs"] == 1
    assert row["utility"] == 0.0  # no answer: the abort message is not scored as one (InjecAgent gave it 1.0)

    lines = _validate_jsonl(Path(row["incident_path"]))  # the schema and the file-level checks
    assert [line["action_type"] for line in lines] == [
        "user_input",
        "assistant_output",
        "tool_call",
        "tool_output",
        "defense_abort",
    ]
    output, abort = lines[-2], lines[-1]
    assert output["contaminated"] is True and abort["contaminated"] is False
    assert abort["parent_id"] == output["entry_id"]
    record = json.loads(abort["content"])
    assert record == {
        "defense": "hfer",
        "tool_output_entry": output["entry_id"],
        "tool_message_index": 3,
        "detector": "D1 Heuristic",
        "layer": None,
        "statistic": None,
        "score": record["score"],
        "threshold": 0.0,
        "reason": row["aborted"],
        "stopped_before_generation": True,
    }
    assert 0.0 <= record["score"] <= 1.0
    assert not any(line["content"] == row["aborted"] for line in lines)  # not passed off as the model's reply

    from rvu_pipelines.cli import cli

    certificate = tmp_path / "certificate.json"
    result = CliRunner().invoke(
        cli,
        ["recover", row["incident_path"], "--state", str(tmp_path / "recovery"), "--cert-out", str(certificate)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert int(re.search(r"seeds (\d+)", result.output).group(1)) >= 1
    recovery = json.loads(certificate.read_text())["runtime_recovery"]
    assert output["entry_id"] in recovery["seed_ids"]  # recovery starts from the output that fired
    assert abort["entry_id"] in recovery["closure_ids"]  # and the abort record is its child in the graph


def _fits(detector, text: str) -> bool:  # type: ignore[no-untyped-def]
    from rvu_pipelines.spectral.errors import ContextLengthError

    try:
        detector.model.tokenize(text)
    except ContextLengthError:
        return False
    return True


def test_the_real_switch_stops_an_episode_and_names_layer_and_statistic(
    scenario, smollm, small_switch, tiny_models, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, hfer_detector=small_switch, hfer_threshold=0.0)  # 0: any output fires
    row = run_episode(scenario, "hfer", smollm, settings, tmp_path / "episode").to_row()
    assert row["error"] is None, row["error"]
    assert row["aborted"].startswith(ABORT_PREFIX) and small_switch.loaded
    switch = small_switch.switch
    assert f"layer {switch.layer} {switch.statistic}" in row["aborted"]
    record = json.loads(json.loads(Path(row["incident_path"]).read_text().splitlines()[-1])["content"])
    assert record["layer"] == switch.layer in (2, 3) and record["statistic"] == switch.statistic in STAT_NAMES
    assert record["detector"] == small_switch.version and 0.0 < record["score"] < 1.0

    version = small_switch.version
    sha = tiny_models["llm"].sha256
    assert version.startswith(f"hfer:{sha[:16]}:sink_free:L{switch.layer}:") and switch.statistic in version
    assert f"t={switch.threshold:.6g}" in version and ":n=8:seed=0:" in version
    assert version.endswith(small_switch.spec.key)

    # kept with the examples it was drawn from: calibration split only, both classes
    kept = json.loads((small_switch.store / f"{small_switch.spec.key}.json").read_text())
    assert kept["version"] == version and kept["identity"]["model_sha256"] == sha
    assert len(kept["examples"]) == 8 and {e["split"] for e in kept["examples"]} == {"calibration"}
    assert sorted({e["label"] for e in kept["examples"]}) == [0, 1]
    # the threshold: at most floor(5 % of 20) = 1 of the 20 clean calibration tool outputs fires, and none of
    # them comes from a held-out user task
    from rvu_pipelines.spectral.agent_switch import benign_outputs

    benign = benign_outputs(small_switch.spec)
    assert kept["benign"]["groups"] == benign["group"].to_list() and benign.height == 20
    assert set(benign["split"]) == {"calibration"} and set(benign["label"]) == {0}
    assert len(set(benign["source"])) == 4  # spread over the suites
    detector = small_switch.detector()
    fitting = [text for text in benign["text"] if _fits(detector, text)]  # the switch cannot score the rest either
    assert kept["benign"]["n_benign"] == len(fitting) >= 15
    fired = [float(switch.score(detector.features(text))[0]) >= switch.threshold for text in fitting]
    assert sum(fired) <= len(fitting) // 20 and kept["benign"]["bayes_threshold"] != switch.threshold
    # once per process, and a later process reads the kept switch instead of calibrating
    from rvu_pipelines.spectral import agent_switch

    assert calibrated_switch(small_switch.spec, small_switch.store) is switch
    agent_switch._SWITCHES.clear()
    assert calibrated_switch(small_switch.spec, small_switch.store) == switch


def test_the_switch_version_keys_the_hfer_cells_and_only_them(scenario, smollm, small_switch, tiny_models, tmp_path):
    """A changed calibration (another draw) gives hfer cells new episode keys, so their stored rows are not
    served; the other cells' keys do not move."""
    sha = tiny_models["llm"].sha256
    other = LazyHferDetector.for_profile(
        "tiny", expected_sha256=sha, store=small_switch.store, size=8, seed=1, layers=(2, 3)
    )

    def harness(hfer_detector) -> Harness:
        return Harness.open(
            smollm,
            profile="tiny",
            model_id=sha,
            detector="heuristic",
            root=tmp_path / "attacks",
            cache_path=tmp_path / "llm_cache.sqlite",
            max_iters=1,
            max_tokens=16,
            hfer_detector=hfer_detector,
        )

    first, second = harness(small_switch), harness(other)
    for defense in ("vanilla", "classifier", "fath", "rvu_v2"):
        assert first.settings_fingerprint(defense) == second.settings_fingerprint(defense)
    assert first.settings_fingerprint("hfer") != second.settings_fingerprint("hfer")
    assert first.settings_fingerprint() == first.settings_fingerprint("vanilla")

    ran = first.run_cell(CANONICAL, "hfer", scenarios=[scenario], progress=False)
    assert ran.new_episodes == 1 and ran.metrics["n"] == 1 and ran.metrics["errors"] == 0
    assert ran.metrics["aborted"] == int(ran.rows["aborted"].is_not_null().sum())
    again = first.run_cell(CANONICAL, "hfer", scenarios=[scenario], progress=False)
    assert again.new_episodes == 0  # same switch, same code: the stored row
    recalibrated = second.run_cell(CANONICAL, "hfer", scenarios=[scenario], progress=False)
    assert recalibrated.new_episodes == 1  # another calibration never reuses it
