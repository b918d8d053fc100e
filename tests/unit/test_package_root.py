"""The package root imports its public names on first use: importing one module loads only what that module needs."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import delayed_delivery


def _loaded_after(statement: str) -> list[str]:
    listing = "print(json.dumps(sorted(m for m in sys.modules if m.startswith('delayed_delivery'))))"
    script = f"import json, sys\n{statement}\n{listing}"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_importing_the_package_loads_only_its_root() -> None:
    assert _loaded_after("import delayed_delivery") == ["delayed_delivery"]


def test_importing_the_model_loads_the_model_and_what_it_imports_not_the_dispatcher_or_the_stores() -> None:
    loaded = _loaded_after("import delayed_delivery.model")
    assert "delayed_delivery.model" in loaded
    for heavy in ("dispatcher", "sqlite_store", "memory", "cost", "settings", "postgres"):
        assert f"delayed_delivery.{heavy}" not in loaded, heavy


def _declared() -> dict[str, str]:
    """Name -> module, from the root's ``if TYPE_CHECKING:`` imports (what type checkers and readers see)."""
    tree = ast.parse(Path(delayed_delivery.__file__).read_text(encoding="utf-8"))
    [block] = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    return {
        alias.name: f"delayed_delivery.{node.module}"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_every_public_name_resolves_to_the_object_its_module_defines() -> None:
    declared = _declared()
    assert set(declared) == set(delayed_delivery.__all__) - {"__version__"}
    for name, module in declared.items():
        assert getattr(delayed_delivery, name) is getattr(importlib.import_module(module), name), name
    assert set(delayed_delivery.__all__) <= set(dir(delayed_delivery))
    assert delayed_delivery.PostgresDelayedMessageStore.__module__ == "delayed_delivery.postgres.store"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        _ = delayed_delivery.NoSuchThing  # type: ignore[attr-defined]
