"""The code's shape (issue 41): the certifier and the checkers in functions a reader can take
in at once, and an engine that only schedules.

A function's length is counted from its ``def`` to its last line, less its docstring: the
docstring teaches the contract (``certify``'s documents each of its options) and is not what
makes a function hard to follow.  Nested functions and methods count on their own, and inside
the function that holds them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LONGEST = 60
"""Lines a function of ``harel_ref/certify/`` or ``stateful/`` may have, its docstring not counted."""

CHECKED = (ROOT / "harel_ref" / "certify", ROOT / "stateful")

ENGINE_LINES = 400
"""Lines ``harel_ref/certify/_engine.py`` may have: it schedules the searches, nothing else."""


def code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of ``function`` from its ``def`` (its decorators not counted) to its end, less
    its docstring."""
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def too_long(folders: tuple[Path, ...], longest: int = LONGEST) -> list[str]:
    """Every function in ``folders`` over ``longest`` lines: ``path:line name (lines)``."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(node) > longest:
                    found.append(f"{path.relative_to(folder.parent)}:{node.lineno} {node.name} ({code_lines(node)})")
    return found


def test_no_function_of_the_certifier_or_the_checkers_is_over_60_lines():
    assert too_long(CHECKED) == []


def test_the_engine_only_schedules():
    lines = len((ROOT / "harel_ref" / "certify" / "_engine.py").read_text().splitlines())
    assert lines < ENGINE_LINES, f"_engine.py has {lines} lines"


def test_a_long_function_is_found_and_its_docstring_is_not_counted(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST - 1))
    (tmp_path / "long.py").write_text(f"def long():\n{body}    return x0\n")  # 61 lines
    (tmp_path / "taught.py").write_text(f'def taught():\n    """A\n    long\n    contract."""\n{body}')  # 60 and 3
    (tmp_path / "nested.py").write_text("class C:\n    def method(self):\n        def inner():\n"
                                        + body.replace("    ", "            ") + "            return x0\n")
    found = too_long((tmp_path,))
    assert [line.split()[1] for line in found] == ["long", "method", "inner"], found
    assert found[0].endswith(f"long ({LONGEST + 1})")
