"""Configuration is read at the edges and passed down: only the settings module, the default-paths module, the
command line and ``rvu doctor`` read the environment (directly: a call to ``env_value``, ``env_flag``,
``is_offline``, ``os.getenv`` or ``os.environ``; handing ``{**os.environ}`` to a child process is no read);
every other library module receives what it needs.

``NOT_YET_PASSED_DOWN`` lists the library modules that still read a setting themselves. The list may only
shrink: a module on it that stops reading the environment must leave it (the test says so), and a module
not on it that starts is refused."""

from __future__ import annotations

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "rvu_pipelines"
READERS = {"env_value", "env_flag", "is_offline", "getenv", "environ"}
EDGES = {"settings.py", "paths.py", "cli.py", "doctor.py"}  # cli_*.py are edges too (the command line)
NOT_YET_PASSED_DOWN = {
    "bounded_io.py",
    "data/sources.py",
    "detectors/corpora.py",
    "detectors/pretrained.py",
    "models/llama_runtime.py",
    "models/llm.py",
    "models/native_probe.py",
    "models/specs.py",
    "models/store.py",
    "recovery/tiers.py",
    "result_memo.py",
    "scale/profile.py",
}


def _reads_environment(path: Path) -> bool:
    tree = ast.parse(path.read_text(), filename=str(path))
    # ``{**os.environ, ...}`` hands the environment to a child process unread: not a configuration read
    passed_on = {
        id(value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        for key, value in zip(node.keys, node.values, strict=True)
        if key is None
    }
    for node in ast.walk(tree):
        if id(node) in passed_on:
            continue
        if isinstance(node, ast.Name) and node.id in READERS:
            return True
        if isinstance(node, ast.Attribute) and node.attr in READERS:
            return True
    return False


def test_only_the_edges_read_the_environment() -> None:
    readers = set()
    for path in sorted(LIBRARY.rglob("*.py")):
        name = path.relative_to(LIBRARY).as_posix()
        if name in EDGES or name.startswith("cli_"):
            continue
        if _reads_environment(path):
            readers.add(name)
    new = sorted(readers - NOT_YET_PASSED_DOWN)
    assert new == [], f"library modules reading the environment (take the value as a parameter instead): {new}"
    done = sorted(NOT_YET_PASSED_DOWN - readers)
    assert done == [], f"these modules no longer read the environment; take them off NOT_YET_PASSED_DOWN: {done}"
