"""Shipped code and the tools around it import the way the import contracts can see.

No ``sys.path`` edits (the package is installed, ``infra/aws/cdk.json`` sets ``PYTHONPATH``), no ``importlib`` or
``__import__`` in the package (an import by string hides a dependency from import-linter), and nothing outside
``tests/`` imports the test suite (benchmarks use the product's own emulator launcher).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Folders whose code runs outside the test suite.
SHIPPED = ("shared/delayed_delivery", "functions", "infra", "benchmarks")


def _files(*folders: str) -> Iterator[tuple[str, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" not in path.parts and "cdk.out" not in path.parts:
                yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ''."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def sys_path_edits(tree: ast.Module) -> list[int]:
    """Lines that change ``sys.path``: a method call on it, an assignment to it or to one of its items."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if _dotted(node.func.value) == "sys.path":
                lines.append(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                base = target.value if isinstance(target, ast.Subscript) else target
                if _dotted(base) == "sys.path":
                    lines.append(node.lineno)
    return lines


def string_imports(tree: ast.Module) -> list[int]:
    """Lines that import a module named by a string: ``importlib.import_module``, ``import_module``, ``__import__``."""
    names = {"importlib.import_module", "import_module", "__import__"}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and _dotted(n.func) in names]


def suite_imports(tree: ast.Module) -> list[int]:
    """Lines that import ``tests`` or one of its modules."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            lines += [node.lineno for a in node.names if a.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tests":
            lines.append(node.lineno)
    return lines


def test_no_shipped_code_edits_sys_path() -> None:
    found = {path: lines for path, tree in _files(*SHIPPED) if (lines := sys_path_edits(tree))}
    assert not found, f"sys.path edited at {found}"


def test_the_package_imports_no_module_by_string() -> None:
    found = {path: lines for path, tree in _files("shared/delayed_delivery") if (lines := string_imports(tree))}
    assert not found, f"imports by string (invisible to the import contracts) at {found}"


def test_nothing_outside_the_suite_imports_it() -> None:
    found = {path: lines for path, tree in _files(*SHIPPED) if (lines := suite_imports(tree))}
    assert not found, f"the test suite imported at {found}"


@pytest.mark.parametrize(
    ("source", "check"),
    [
        ("import sys\nsys.path.insert(0, 'x')\n", sys_path_edits),
        ("import sys\nsys.path.append('x')\n", sys_path_edits),
        ("import sys\nsys.path[:0] = ['x']\n", sys_path_edits),
        ("import sys\nsys.path += ['x']\n", sys_path_edits),
        ("import importlib\nm = importlib.import_module('.postgres.store', 'p')\n", string_imports),
        ("from importlib import import_module\nm = import_module('x')\n", string_imports),
        ("m = __import__('x')\n", string_imports),
        ("def f():\n    from tests.fixtures.azurite import start_azurite\n", suite_imports),
        ("import tests.fixtures\n", suite_imports),
    ],
)
def test_each_check_finds_what_it_looks_for(source: str, check: object) -> None:
    assert check(ast.parse(source)), source  # type: ignore[operator]
    assert not check(ast.parse("import sys\nprint(sys.path)\nfrom .tests import x\n")), "a plain read is fine"  # type: ignore[operator]
