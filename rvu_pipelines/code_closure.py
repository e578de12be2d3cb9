"""The code a step runs: the first-party modules one module reaches by import, and a digest over their bytes.

A stored result (``result_memo``) and a Dagster asset's ``code_version`` name exactly the code that produced
them: the step's own module, every first-party module it imports at any depth (function-level imports
too), the packages those modules live in (their ``__init__`` runs on import), and every module of a plug-in
package a catalog loads by name (``import_package_modules("...")``). An edit anywhere else (another
domain's asset, a test, the docs) leaves the digest as it was; an edit inside changes it.

The closure is read from the source text, nothing is imported, so computing it has no side effects.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from pathlib import Path

from rvu_pipelines.paths import project_root

FIRST_PARTY = ("rvu_pipelines", "assets", "resources", "sensors")
PLUGIN_LOADER = "import_package_modules"


@functools.cache
def module_file(module: str, root: Path) -> Path | None:
    """The source file of a first-party module under ``root`` (a package's ``__init__.py``), else None; looked up
    once per process (a module that appears later is a new name, and is looked up then)."""
    if module.split(".")[0] not in FIRST_PARTY:
        return None
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n]+)", re.M)
_PLUGINS = re.compile(PLUGIN_LOADER + r"\(\s*[\"']([\w.]+)[\"']")


def _names(text: str) -> list[str]:
    """``a, b as c`` (in parentheses or not, with comments) -> [a, b]."""
    text = re.sub(r"#[^\n]*", "", text).strip("()\\ \t\n")
    return [part.split()[0] for part in text.split(",") if part.strip()]


def _stamp(path: Path) -> tuple[int, int]:
    """What says a file changed (modification time and size), so a long-running process sees an edit."""
    status = path.stat()
    return status.st_mtime_ns, status.st_size


@functools.cache
def _read_imports(module: str, path: Path, stamp: tuple[int, int]) -> tuple[frozenset[str], tuple[str, ...]]:
    """What one file imports (at any depth, in functions too) and which plug-in packages it loads; read once per
    file version, so the closures of several steps share the reading. A line that only looks like an import (in
    a docstring) can add a module, never lose one: the digest then covers more than it must, never less."""
    package = _package_of(module, path)
    text = path.read_text(encoding="utf-8")
    found: set[str] = set()
    for dots, name, imported in _FROM_IMPORT.findall(text):
        if dots:
            parts = package.split(".")
            base = parts[: len(parts) - len(dots) + 1]
            target = ".".join([*base, name] if name else base)
        else:
            target = name
        found.add(target)
        found.update(f"{target}.{alias}" for alias in _names(imported))  # a submodule, if it is one
    for imported in _IMPORT.findall(text):
        found.update(_names(imported))
    return frozenset(found), tuple(sorted(set(_PLUGINS.findall(text))))


def _imported(module: str, path: Path, root: Path) -> set[str]:
    """The first-party modules one file brings in, with their parent packages; a plug-in package's modules are
    listed afresh each time, so a new plug-in file joins the closure."""
    found, plugin_packages = _read_imports(module, path, _stamp(path))
    names = set(found)
    for plugins in plugin_packages:
        folder = root.joinpath(*plugins.split("."))
        names.add(plugins)
        names.update(f"{plugins}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__")
        names.update(f"{plugins}.{p.parent.name}" for p in folder.glob("*/__init__.py"))
    with_parents: set[str] = set()
    for name in names:
        parts = name.split(".")
        with_parents.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in with_parents if module_file(name, root) is not None}


@functools.cache
def _file_digest(path: Path, stamp: tuple[int, int]) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_root(module: str) -> Path:
    """The folder holding the top-level package of ``module`` as this process imported it (the checkout, or
    wherever the packages are installed), else the project root."""
    loaded = sys.modules.get(module)
    file = getattr(loaded, "__file__", None)
    if file is None:
        return project_root().resolve()
    path = Path(file).resolve()
    depth = module.count(".") + (2 if path.name == "__init__.py" else 1)
    return path.parents[depth - 1]


def module_closure(module: str, root: Path | None = None) -> dict[str, Path]:
    """Every first-party module ``module`` runs when imported and called: name -> source file, sorted.
    ``root``: where the sources are (default: where ``module`` was imported from, ``source_root``)."""
    root = (root or source_root(module)).resolve()
    start = module_file(module, root)
    if start is None:
        raise ValueError(f"{module} is not a first-party module under {root} (one of {', '.join(FIRST_PARTY)})")
    seen: dict[str, Path] = {}
    pending = [module, *(".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1))]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        path = module_file(name, root)
        if path is None:
            continue
        seen[name] = path
        pending.extend(sorted(_imported(name, path, root) - seen.keys()))
    return dict(sorted(seen.items()))


def code_digest(module: str, root: Path | None = None) -> str:
    """sha256 over the names and bytes of :func:`module_closure` (each file read again only when it changed)."""
    closure = module_closure(module, root)  # root None: where the module was imported from
    lines = [f"{name} {_file_digest(path, _stamp(path))}" for name, path in closure.items()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def code_version_of(module: str) -> str:
    """The short form a Dagster asset carries as its ``code_version`` (16 hex characters)."""
    return code_digest(module)[:16]
