"""Memory-poisoning attacks register themselves from their own module; the study's axis names exactly them."""

from __future__ import annotations

import pytest

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.attack_catalog import (
    ATTACK_PACKAGE,
    poisoning_attack,
    poisoning_attack_spec,
    registered_poisoning_attacks,
)
from rvu_pipelines.memory_poisoning.study_cells import ATTACKS, StudyConfig, build_cell


def test_the_study_axis_names_exactly_the_registered_attacks() -> None:
    registered = registered_poisoning_attacks()
    assert sorted(ATTACKS) == sorted(registered)
    for name, spec in registered.items():
        assert spec.name == name and spec.build_cell.__module__.startswith(ATTACK_PACKAGE + ".")
    labels = [spec.label for spec in registered.values()]
    assert len(set(labels)) == len(labels)
    assert {n for n, s in registered.items() if s.in_paper} == {"agentpoison", "minja", "injecmem"}  # seed 003
    assert [registered[n].label for n in ATTACKS if registered[n].in_paper] == ["AP", "MJ", "IM"]  # the paper's order


def test_an_unknown_attack_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(MemoryPoisoningInputError, match="unknown attack 'nope'.*injecmem"):
        build_cell("nope", {}, None, StudyConfig())  # type: ignore[arg-type]
    assert poisoning_attack_spec("minja").label == "MJ"


def test_a_name_registered_twice_from_two_modules_is_refused() -> None:
    def impostor(frames, embed, config):  # noqa: ANN001, ANN202 - a builder's shape
        raise AssertionError("never built")

    impostor.__module__ = "somewhere.else"
    with pytest.raises(MemoryPoisoningInputError, match="Two memory-poisoning attacks are registered as 'minja'"):
        poisoning_attack("minja", label="MJ2")(impostor)
    assert poisoning_attack_spec("minja").build_cell.__module__.endswith("attacks.minja")
