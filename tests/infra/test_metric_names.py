"""Every custom metric the AWS stacks alarm on or graph (``infra/aws``: the endpoint, the tier, the schedule timer) is
a name the package emits: a renamed metric in the code fails here, not as an alarm that never fires."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The stacks' helpers that build one of our own EMF metrics from its name (`infra/aws/alarms.py` and the
#: constructs' wrappers over it), and the CDK keyword that names one.
HELPERS = {"product_metric", "_metric", "metric", "custom"}


def _stack_metrics() -> dict[str, set[str]]:
    """Metric name -> the infra modules that use it."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "infra" / "aws").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            values = [node.args[0]] if name in HELPERS and node.args else []
            values += [k.value for k in node.keywords if k.arg == "metric_name"]
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.setdefault(value.value, set()).add(path.name)
    return found


def _emitted_literals() -> set[str]:
    """Every quoted word in the package's modules (metric names are emitted by name)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "shared" / "delayed_delivery").rglob("*.py"))
    return set(re.findall(r"[\"']([A-Z][A-Za-z]+)[\"']", text))


def test_every_metric_the_stacks_use_is_emitted_by_the_package() -> None:
    metrics = _stack_metrics()
    assert len(metrics) >= 15, f"the scan found too few metrics to mean anything: {sorted(metrics)}"
    missing = {name: sorted(where) for name, where in metrics.items() if name not in _emitted_literals()}
    assert not missing, f"alarmed or graphed, but no module of the package emits them: {missing}"
