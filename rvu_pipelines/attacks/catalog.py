"""The attack registry: an attack is a name, a description and a rewrite of one scenario's injection.

A cell of the attack table is benchmark × attack × defense. An attack sees the scenario and an
:class:`AttackContext` (the agent's model, the defense of the cell, where optimised strings are kept) and returns
the scenario with its injection rewritten through the scenario's own ``with_injection``; the judge, the tools and
the user task stay the benchmark's. ``fingerprint`` names everything that decides the rewritten text (a stored
string's digest), so an episode under a changed attack never reuses a stored row.

A new attack is one module of this package that calls :func:`register` at import, plus its test (the
catalog imports every module of the package on first lookup, so importing the catalog stays cheap).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.plugins import import_package_modules
from rvu_pipelines.scenarios.axes import ATTACKS, NATIVE
from rvu_pipelines.scenarios.contract import Scenario

GateCheck = Callable[[str, Scenario, frozenset[str]], bool]  # (defense, scenario, tools) -> all pass the gate


@dataclass(frozen=True)
class AttackContext:
    """What an attack may know when it rewrites a scenario: the agent's model and the cell's defense.

    ``strings_dir``: where optimised strings are stored (committed under configs/attacks); ``gguf_path``: the
    agent's weights (a forged turn reads the chat template from them); ``gate_check``: the tool gate's decision,
    for the attack adapted to the gate."""

    profile: str
    model_sha256: str
    defense: str
    strings_dir: Path
    gguf_path: Path | None = None
    # what an attacker who knows the gate's configuration computes (the harness builds it from its settings)
    gate_check: GateCheck | None = None


@dataclass(frozen=True)
class AttackSpec:
    name: str
    description: str
    rewrite: Callable[[Scenario, AttackContext], Scenario]
    fingerprint: Callable[[AttackContext], str]  # "" when the rewrite depends on nothing beyond the scenario


_REGISTRY: dict[str, AttackSpec] = {}


def register(spec: AttackSpec) -> AttackSpec:
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"Attack {spec.name!r} is registered twice.")
    _REGISTRY[spec.name] = spec
    return spec


def _load_plugins() -> None:
    import_package_modules("rvu_pipelines.attacks")


def registered() -> dict[str, AttackSpec]:
    """Every registered attack by name, sorted."""
    _load_plugins()
    return dict(sorted(_REGISTRY.items()))


def get_attack(name: str, field: str = "attack") -> AttackSpec:
    """The attack called ``name``; an unknown name is refused naming ``field`` and the allowed values."""
    attacks = registered()
    if name not in attacks:
        raise ConfigError(f"Unknown {field} {name!r}; allowed values: {', '.join(ATTACKS)}.")
    return attacks[name]


def attacked(scenario: Scenario, name: str, context: AttackContext) -> Scenario:
    """``scenario`` under the attack ``name`` (``native``: unchanged)."""
    return get_attack(name).rewrite(scenario, context)


def attack_fingerprint(name: str, context: AttackContext) -> str:
    """What decides the attack's text for episode keys; ``native`` is "" so its keys are the benchmark's own."""
    return "" if name == NATIVE else f"{name}:{get_attack(name).fingerprint(context)}"


register(
    AttackSpec(
        NATIVE,
        "the benchmark's own injections, unchanged",
        rewrite=lambda scenario, _context: scenario,
        fingerprint=lambda _context: "",
    )
)
register(
    AttackSpec(
        "no_attack",
        "control: the injection removed, so the episode measures utility without attack",
        rewrite=lambda scenario, _context: scenario.with_injection(""),
        fingerprint=lambda _context: "empty",
    )
)
