"""Plug-ins register themselves when their module is imported; this imports every module of a plug-in package
once, so a catalog (detectors, defenses) finds a new plug-in from its file alone."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

_IMPORTED: set[str] = set()


def import_package_modules(package: str, *, skip: Callable[[str], bool] = lambda name: False) -> None:
    """Import every module of ``package`` (sorted, once per process) except those ``skip`` names."""
    if package in _IMPORTED:
        return
    found = importlib.import_module(package)
    for module in sorted(pkgutil.iter_modules(found.__path__), key=lambda m: m.name):
        if not skip(module.name):
            importlib.import_module(f"{package}.{module.name}")
    _IMPORTED.add(package)
