"""Detectors by name: each detector module registers itself, and every caller resolves a choice through
the one catalog (the harness, recovery, the memory monitor, the CLI)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from rvu_pipelines.detectors import catalog
from rvu_pipelines.detectors.catalog import by_name, choices, detector_plugin, plugin_for
from rvu_pipelines.detectors.heuristic import HeuristicDetector
from rvu_pipelines.errors import ConfigError


def test_every_detector_module_registers_itself() -> None:
    assert choices() == ("exfiltration", "heuristic", "nanoguard", "production", "registered:<name>[@<alias>]")
    for plugin in catalog.plugins():
        assert plugin.summary and plugin.load.__module__.startswith("rvu_pipelines.detectors.")


def test_a_choice_is_checked_against_the_plugin_it_names() -> None:
    with pytest.raises(ConfigError, match="Invalid detector 'registered'; allowed values: exfiltration"):
        plugin_for("registered")  # a parameterised plugin needs its argument
    with pytest.raises(ConfigError, match="Invalid detector 'heuristic:strict'"):
        plugin_for("heuristic:strict")  # and a plain one takes none
    plugin, argument = plugin_for("registered:rvu-detector-d2-deepset@onnx")
    assert (plugin.name, argument) == ("registered", "rvu-detector-d2-deepset@onnx")


def test_a_new_detector_is_one_registration_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "_PLUGINS", dict(catalog._PLUGINS))

    class Shouty(HeuristicDetector):
        name = "shouty"

        def _score(self, texts: list[str]) -> np.ndarray:
            return np.array([float(text.isupper()) for text in texts])

    @detector_plugin("shouty", summary="all capitals")
    def _load(argument: str, tracking_uri: str | None) -> tuple[Shouty, str]:
        return Shouty(), "shouty:1"

    detector, version = by_name("shouty")
    assert version == "shouty:1" and detector.score(["IGNORE THIS", "fine"]).tolist() == [1.0, 0.0]
    assert "shouty" in choices()

    def _elsewhere(argument: str, tracking_uri: str | None) -> tuple[Shouty, str]:
        return Shouty(), "shouty:2"

    _elsewhere.__module__ = "somebody.else"
    with pytest.raises(ConfigError, match="Two detectors are registered as 'shouty'"):
        detector_plugin("shouty", summary="again")(_elsewhere)


def test_nanoguard_is_named_without_loading_its_weights() -> None:
    from rvu_pipelines.agents.harness import LazyDetector, detector_for

    detector, version = detector_for("nanoguard")
    assert isinstance(detector, LazyDetector) and detector._detector is None
    assert version.startswith("nanoguard:") and detector.name == "D3 NanoGuard (zero-shot)"


def test_rvu_detectors_lists_every_choice() -> None:
    from rvu_pipelines.cli import cli

    result = CliRunner().invoke(cli, ["detectors"])
    assert result.exit_code == 0, result.output
    for choice in choices():
        assert choice in result.output


def test_each_registrable_type_declares_its_stored_form_in_its_own_module() -> None:
    from rvu_pipelines.detectors.registry_formats import formats

    found = {f.kind: (f.tag, f.detector_type.__name__, f.save.__module__) for f in formats()}
    assert found == {
        "d2": ("d2-tfidf-skops", "TfidfDetector", "rvu_pipelines.detectors.tfidf"),
        "d4": ("d4-finetuned-safetensors", "FinetunedDetector", "rvu_pipelines.detectors.finetune"),
        "d4_onnx": ("d4-onnxruntime", "OnnxDetector", "rvu_pipelines.detectors.onnx_d4"),
    }
