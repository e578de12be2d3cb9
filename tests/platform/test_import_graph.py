"""The subpackages of rvu_pipelines/ import each other without a cycle, and so do the modules inside each
subpackage, so each can be read, tested and changed from its dependencies up. A function-level or
TYPE_CHECKING import does not hide an edge: every import statement counts."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[2] / "rvu_pipelines"
ROOT = PACKAGE.name

# Edges of a known cycle outside agents/scenarios, tolerated until removed; each names its TODO.
# An edge listed here is left out of the cycle check only, never out of the scenarios -> agents rule.
KNOWN_CYCLE_EDGES: frozenset[tuple[str, str]] = frozenset()


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str | None:
    """The first-level unit (subpackage or module) of rvu_pipelines that a dotted module name is in."""
    parts = module.split(".")
    if parts[0] != ROOT or len(parts) < 2:
        return None
    return f"{ROOT}.{parts[1]}"


def _is_submodule(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def _imported(path: Path) -> set[str]:
    """Every module an import statement in the file names, at any depth (functions, TYPE_CHECKING too)."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            if module == ROOT:  # ``from rvu_pipelines import paths`` names a submodule, ``__version__`` does not
                found.update(f"{ROOT}.{alias.name}" for alias in node.names if _is_submodule(alias.name))
    return found


def import_graph() -> nx.DiGraph:
    """Units of rvu_pipelines (e.g. ``rvu_pipelines.agents``) with an edge for each import between two."""
    graph = nx.DiGraph()
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _unit(_module(path))
        if source is None:
            continue
        graph.add_node(source)
        for module in _imported(path):
            target = _unit(module)
            if target is not None and target != source:
                graph.add_edge(source, target)
    return graph


def test_graph_sees_the_packages() -> None:
    graph = import_graph()
    assert {"rvu_pipelines.agents", "rvu_pipelines.scenarios", "rvu_pipelines.detectors"} <= set(graph)
    assert graph.has_edge("rvu_pipelines.agents", "rvu_pipelines.scenarios")


def test_no_cycle_between_subpackages() -> None:
    graph = import_graph()
    graph.remove_edges_from(KNOWN_CYCLE_EDGES)
    cycles = sorted(" -> ".join(cycle) for cycle in nx.simple_cycles(graph))
    assert not cycles, f"import cycles between subpackages of rvu_pipelines/: {cycles}"


def test_scenarios_never_import_agents() -> None:
    """Scenarios are the attack side: the agents (defenses, harness) import them, never the reverse."""
    assert not import_graph().has_edge("rvu_pipelines.scenarios", "rvu_pipelines.agents")


def module_graph() -> nx.DiGraph:
    """Modules of rvu_pipelines with an edge for each import between two.

    ``from pkg import sub`` names the submodule, not ``pkg/__init__`` (a package's ``__init__`` re-exports
    its modules, and a module reaching a sibling through it is still an edge to the sibling).
    """
    modules = {_module(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for source, path in modules.items():
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                for alias in node.names:
                    targets.append(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module)
            graph.add_edges_from((source, target) for target in targets if target in modules and target != source)
    return graph


def test_module_graph_sees_imports() -> None:
    graph = module_graph()
    assert graph.has_edge("rvu_pipelines.recovery.pipeline", "rvu_pipelines.recovery.certificate")


def test_no_cycle_between_modules() -> None:
    """Inside a subpackage too: no pair of modules leans on each other (the usual sign of a misplaced type)."""
    graph = module_graph()
    cycles = sorted(" -> ".join(cycle) for cycle in nx.simple_cycles(graph))
    assert not cycles, f"import cycles between modules of rvu_pipelines/: {cycles}"
