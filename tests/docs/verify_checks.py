"""docs/verify.md explains every check ``aws verify`` and ``azure verify`` report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DOC = (Path(__file__).resolve().parents[2] / "docs" / "verify.md").read_text(encoding="utf-8")


def assert_documented(document: dict[str, Any]) -> None:
    """Every check of a ``--json`` report is named in docs/verify.md."""
    missing = {c["check"] for c in document["checks"] if f"`{c['check']}`" not in DOC}
    assert not missing, f"not explained in docs/verify.md: {sorted(missing)}"
