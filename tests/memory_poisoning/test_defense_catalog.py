"""Write-time defenses register themselves from their own module; the matrix's axis names exactly them."""

from __future__ import annotations

import pytest

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.defense_catalog import (
    DEFENSE_PACKAGE,
    registered_write_defenses,
    write_defense_spec,
)
from rvu_pipelines.memory_poisoning.defenses import CompositeDetector, EnergyDetector, MemsadDetector
from rvu_pipelines.memory_poisoning.study import EXTRA_DEFENSES, PAPER_DEFENSES, detector_suite


def test_the_matrix_axis_names_exactly_the_registered_defenses() -> None:
    registered = registered_write_defenses()
    assert sorted((*PAPER_DEFENSES, *EXTRA_DEFENSES)) == sorted(registered)
    assert {n for n, s in registered.items() if s.in_paper} == set(PAPER_DEFENSES)
    for spec in registered.values():
        assert spec.build.__module__.startswith(DEFENSE_PACKAGE + ".")


def test_the_suite_builds_fresh_detectors_with_the_studys_kappas() -> None:
    suite = detector_suite(1.5, composite_kappa=3.0)
    assert list(suite) == [*PAPER_DEFENSES, *EXTRA_DEFENSES]
    memsad = suite["memsad"]()
    assert isinstance(memsad, MemsadDetector) and memsad is not suite["memsad"]()
    assert memsad.kappa == 1.5 and isinstance(suite["energy"](), EnergyDetector)
    composite = suite["composite"]()
    assert isinstance(composite, CompositeDetector) and composite.name == "composite"
    assert {m.kappa for m in composite.members} == {3.0}


def test_an_unknown_defense_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(MemoryPoisoningInputError, match="unknown write-time defense 'nope'.*memsad"):
        write_defense_spec("nope")
