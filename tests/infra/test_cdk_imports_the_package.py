"""The CDK app takes the package's names and numbers from the package: no copied environment variable names, queue
suffixes or limits, so a change in the package cannot leave the stack configuring functions with stale values."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Limits and defaults the package owns (SQS's longest delay, the visibility limit and the park cap, the packing
#: and message sizes, the coarse bucket, the park in-flight default).
PACKAGE_NUMBERS = {900, 43_200, 42_600, 65_536, 262_144, 86_400, 100_000}
#: Names only the package may spell: its environment variables (a string starting so) and the delay queue's suffix
#: (a string ending so, as in ``f"{name}-delay.fifo"``). Sentences that mention them are prose.
ENV_NAMES = ("DELAYED_DELIVERY_", "POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE")
SUFFIXES = ("-delay.fifo",)


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def copies(source: str) -> list[str]:
    """The package's numbers and names spelled out in ``source`` (docstrings and comments are prose, not copies)."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in prose:
            continue
        value = node.value
        if isinstance(value, int) and not isinstance(value, bool) and value in PACKAGE_NUMBERS:
            found.append(f"line {node.lineno}: {value}")
        elif isinstance(value, str) and (value.startswith(ENV_NAMES) or value.endswith(SUFFIXES)):
            found.append(f"line {node.lineno}: {value!r}")
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "infra" / "aws").glob("*.py")), ids=lambda p: p.name)
def test_the_cdk_copies_no_constant_of_the_package(path: Path) -> None:
    assert copies(path.read_text(encoding="utf-8")) == []


def test_the_check_finds_copies_but_not_prose() -> None:
    source = '''"""Sets DELAYED_DELIVERY_ERROR_QUEUE, waits 900 s."""
HOP = 900
ENV = {"DELAYED_DELIVERY_ERROR_QUEUE": "e"}
NAME = f"{queue}-delay.fifo"
OK = 30  # 900 in a comment is prose
REASON = "no redrive policy on -delay.fifo queues"
'''
    assert copies(source) == ["line 2: 900", "line 3: 'DELAYED_DELIVERY_ERROR_QUEUE'", "line 4: '-delay.fifo'"]
