"""Detectors by name: the one way every place that lets a user pick a detector (the classifier defense, the
memory monitor's USER-channel check, recovery's contamination signal, the CLI, the asset configs) turns a
choice into a detector.

A detector plugs in by decorating its loader in its own module::

    @detector_plugin("heuristic", summary="D1's patterns")
    def _load(argument: str, tracking_uri: str | None) -> tuple[InjectionDetector, str]:
        detector = HeuristicDetector()
        return detector, f"heuristic:{detector.name}"

and is found by name once its module is imported: :func:`by_name` imports every module of this package
first (plain imports: torch, transformers and MLflow load only inside the loaders), so a new detector is one
file plus its test. A choice is ``<name>`` or, for a plugin with a parameter, ``<name>:<argument>``
(``registered:<model>@<alias>``). The version string a loader returns keys caches and is written into
certificates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rvu_pipelines.detectors.base import InjectionDetector
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.plugins import import_package_modules

Loader = Callable[[str, "str | None"], "tuple[InjectionDetector, str]"]
PRODUCTION_CHOICE = "production"  # the default everywhere: the calibrated detector in the MLflow registry


@dataclass(frozen=True)
class DetectorPlugin:
    """One selectable detector: its name, what it is, how to load it, and (where it is known without loading
    the weights) its version, so a cell whose episodes are all saved never loads it."""

    name: str
    summary: str
    load: Loader
    parameter: str = ""  # e.g. "<name>[@<alias>]": the choice is "<name>:<argument>"
    display_name: str = ""  # the detector's own name, for a stand-in that loads it on first use
    version: Callable[[], str] | None = None

    @property
    def choice(self) -> str:
        return f"{self.name}:{self.parameter}" if self.parameter else self.name


_PLUGINS: dict[str, DetectorPlugin] = {}


def detector_plugin(
    name: str,
    *,
    summary: str,
    parameter: str = "",
    display_name: str = "",
    version: Callable[[], str] | None = None,
) -> Callable[[Loader], Loader]:
    """Register the decorated loader ``(argument, tracking_uri) -> (detector, version)`` under ``name``."""

    def register(load: Loader) -> Loader:
        existing = _PLUGINS.get(name)
        if existing is not None and existing.load.__module__ != load.__module__:
            raise ConfigError(
                f"Two detectors are registered as '{name}': in {existing.load.__module__} and {load.__module__}."
            )
        _PLUGINS[name] = DetectorPlugin(name, summary, load, parameter, display_name, version)
        return load

    return register


def import_detector_modules() -> None:
    """Import every module of this package once, so each registers its plugins. MLflow's model-from-code
    files (``mlflow_*.py``) are skipped: MLflow runs them when it loads a logged model, nothing imports them."""
    import_package_modules("rvu_pipelines.detectors", skip=lambda name: name.startswith("mlflow_"))


def plugins() -> tuple[DetectorPlugin, ...]:
    """Every registered detector, sorted by name."""
    import_detector_modules()
    return tuple(_PLUGINS[name] for name in sorted(_PLUGINS))


def choices() -> tuple[str, ...]:
    """What a user may type, for help texts and error messages."""
    return tuple(plugin.choice for plugin in plugins())


def plugin_for(choice: str) -> tuple[DetectorPlugin, str]:
    """The plugin ``choice`` names and its argument, or a clear error listing the allowed values."""
    import_detector_modules()
    name, _, argument = choice.partition(":")
    plugin = _PLUGINS.get(name)
    if plugin is None or bool(plugin.parameter) != (":" in choice):
        raise ConfigError(f"Invalid detector '{choice}'; allowed values: {', '.join(choices())}.")
    return plugin, argument


def by_name(choice: str, tracking_uri: str | None = None) -> tuple[InjectionDetector, str]:
    """The detector ``choice`` names and its version string. ``tracking_uri``: the MLflow registry registered
    detectors come from (the tracker resource's, resolved at the edge); None uses the platform default."""
    plugin, argument = plugin_for(choice)
    return plugin.load(argument, tracking_uri)


def content_check_for(choice: str = PRODUCTION_CHOICE, tracking_uri: str | None = None, threshold: float = 0.5) -> Any:
    """The memory monitor's USER-channel content check backed by the detector ``choice`` names (default: the
    production detector), for ``UserChannel(content_check=...)``; flagged at ``threshold``."""
    from rvu_pipelines.memory.user_channel import ScoreContentCheck

    detector, version = by_name(choice, tracking_uri)
    return ScoreContentCheck(version, lambda text: float(detector.score([text])[0]), threshold)
