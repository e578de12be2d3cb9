"""Modules meet through public names: no module imports, or reaches into, another module's private names.

A leading underscore is a promise that only its own module depends on it, so the module can change it freely;
splitting a file by length and reaching back across the cut breaks that promise, and this test refuses it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("rvu_pipelines", "assets", "resources", "sensors", "scripts", "benchmarks")

# Third-party private API the product relies on, each with the reason (llama-cpp-python keeps its low-level
# model and context handles, and the chat-completion converter the server reuses, behind an underscore).
THIRD_PARTY = {
    "_model": "llama_cpp.Llama's model handle (chat template, vocabulary, LoRA calls)",
    "_ctx": "llama_cpp.Llama's context handle (KV-cache state save / restore)",
    "_chat_handlers": "llama_cpp.Llama's registered chat formats",
    "_llama": "llama_cpp's tokenizer wrapper keeps its Llama here",
    "_convert_completion_to_chat": "llama_cpp.llama_chat_format's completion-to-chat converter",
    "_replace": "namedtuple's public copy-with-changes method (underscored to avoid field names)",
}


def _modules() -> dict[str, Path]:
    found = {}
    for root in PRODUCT:
        for path in sorted((REPO / root).rglob("*.py")):
            dotted = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[dotted.removesuffix(".__init__")] = path
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_here(tree: ast.Module) -> set[str]:
    """Private names a module defines: functions, classes, module and class variables, ``self._x`` attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[-1])
    return {name for name in names if _private(name)}


def test_no_module_uses_another_modules_private_names() -> None:
    modules = _modules()
    trees = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in modules.items()}
    definers: dict[str, set[str]] = defaultdict(set)
    defined = {name: _defined_here(tree) for name, tree in trees.items()}
    for name, names in defined.items():
        for private in names:
            definers[private].add(name)

    offenders = []
    for name, tree in trees.items():
        where = modules[name].relative_to(REPO)
        package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
        bound: dict[str, str] = {}  # local name -> one of our modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, source] if source else base)
                for alias in node.names:
                    if _private(alias.name) and alias.name not in THIRD_PARTY:
                        offenders.append(f"{where}:{node.lineno} imports {alias.name} from {source}")
                    if f"{source}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr) or node.attr in THIRD_PARTY:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Name) and owner.id in bound:
                offenders.append(f"{where}:{node.lineno} reads {owner.id}.{node.attr} of {bound[owner.id]}")
            elif node.attr not in defined[name] and definers.get(node.attr):
                others = ", ".join(sorted(definers[node.attr]))
                offenders.append(f"{where}:{node.lineno} reaches into {ast.unparse(node)} (defined in {others})")
    assert offenders == [], "\n".join(offenders)
