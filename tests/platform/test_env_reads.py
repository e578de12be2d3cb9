"""Configuration is read at the edges and passed down: only the settings module, the default-paths module, the
command line and ``rvu doctor`` read the environment (directly: a call to ``env_value``, ``env_flag``,
``is_offline``, ``os.getenv`` or ``os.environ``; handing ``{**os.environ}`` to a child process is no read).
Every other library module receives what it needs as a parameter, or, where the caller leaves it out, from
one named function of an edge (``paths.public_sources()``, ``settings.max_input_bytes()``), which parses and
validates the variable in one place."""

from __future__ import annotations

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "rvu_pipelines"
READERS = {"env_value", "env_flag", "is_offline", "getenv", "environ"}
EDGES = {"settings.py", "paths.py", "cli.py", "doctor.py"}  # cli_*.py are edges too (the command line)


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
    readers = []
    for path in sorted(LIBRARY.rglob("*.py")):
        name = path.relative_to(LIBRARY).as_posix()
        if name in EDGES or name.startswith("cli_"):
            continue
        if _reads_environment(path):
            readers.append(name)
    assert readers == [], f"library modules reading the environment (take the value as a parameter instead): {readers}"


def test_the_check_sees_a_read(tmp_path) -> None:
    """The detector itself: a direct read, an offline check and an attribute read are each found; handing the
    environment on to a child process is not."""
    reads = {
        "value.py": "from rvu_pipelines.settings import env_value\nx = env_value('RVU_HOME')\n",
        "offline.py": "from rvu_pipelines.settings import is_offline\nif is_offline():\n    pass\n",
        "environ.py": "import os\nx = os.environ.get('RVU_HOME')\n",
    }
    for name, text in reads.items():
        (tmp_path / name).write_text(text)
        assert _reads_environment(tmp_path / name), name
    (tmp_path / "child.py").write_text("import os\nenv = {**os.environ, 'A': '1'}\n")
    assert not _reads_environment(tmp_path / "child.py")
