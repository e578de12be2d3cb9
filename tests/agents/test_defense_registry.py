"""Defenses by name: each defense module registers its pipeline builder, and the table's axis names exactly
the registered defenses."""

from __future__ import annotations

import pytest

from rvu_pipelines.agents.defenses import registry
from rvu_pipelines.agents.defenses.registry import builder_for, defense_builder, registered_defenses
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.axes import DEFENSES


def test_the_axis_names_exactly_the_registered_defenses() -> None:
    assert registered_defenses() == tuple(sorted(DEFENSES))
    assert builder_for("hfer", DEFENSES).__module__ == "rvu_pipelines.agents.defenses.hfer"
    assert builder_for("rvu_v2", DEFENSES) is builder_for("rvg", DEFENSES)  # one gated agent, four names


def test_an_unknown_or_unlisted_defense_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="Unknown defense 'firewall'; allowed values: vanilla, classifier"):
        builder_for("firewall", DEFENSES)
    with pytest.raises(ConfigError, match="Unknown defense 'hfer'"):
        builder_for("hfer", ("vanilla",))  # registered, but not on the axis the caller allows


def test_a_second_builder_for_a_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_BUILDERS", dict(registry._BUILDERS))

    def other(defense, start, scenario, settings):  # type: ignore[no-untyped-def]
        return []

    with pytest.raises(ConfigError, match="Two builders are registered for the defense 'vanilla'"):
        defense_builder("vanilla")(other)
