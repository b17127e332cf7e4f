"""No two modules of harel-ref import each other, directly or around a loop.

Imports inside functions count too: a lazy import is how a cycle hides, and a cycle is what
makes a change in one checker reach into another.  The graph is read from the source (the
``ast``), so it needs no import to run and sees every module, optional drivers included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = {"harel_ref": ROOT / "harel_ref", "harel_ref.model": ROOT / "model",
            "harel_ref.stateful": ROOT / "stateful"}
"""Each package of the wheel and the folder it comes from (pyproject.toml's package-dir)."""


def modules(packages: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Every module: its dotted name -> (file, whether it is a package's __init__)."""
    found = {}
    for prefix, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = [part for part in path.relative_to(folder).with_suffix("").parts if part != "__init__"]
            found[".".join([prefix, *parts])] = (path, path.name == "__init__.py")
    return found


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports, anywhere in its source."""
    known = modules(packages)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, (path, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                named = [base] + [f"{base}.{alias.name}" for alias in node.names]  # a module, or a name in one
            else:
                continue
            graph[name] |= {target for target in named if target in known and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_harel_ref_imports_itself_around_a_loop():
    graph = import_graph(PACKAGES)
    assert len(graph) > 40 and graph["harel_ref.certify._engine"]  # it read the modules
    assert cycles(graph) == []


def test_a_loop_hidden_in_a_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "history.py").write_text("from .record import Record\n\ndef check():\n    from .linearize import judge\n")
    (package / "linearize.py").write_text("from .history import check\n")
    (package / "record.py").write_text("class Record: ...\n")
    assert cycles(import_graph({"pkg": package})) == [["pkg.history", "pkg.linearize"]]
