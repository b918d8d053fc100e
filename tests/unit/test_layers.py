"""Every module of the package belongs to exactly one layer of the import contracts in pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shared" / "delayed_delivery"


def _contracts() -> list[dict[str, object]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["contracts"])


def _core_modules() -> set[str]:
    contract = next(c for c in _contracts() if str(c["name"]).startswith("The core imports"))
    return {str(m) for m in contract["source_modules"]}  # type: ignore[attr-defined]


def _layered_packages() -> set[str]:
    contract = next(c for c in _contracts() if c["type"] == "layers")
    return {p.strip() for layer in contract["layers"] for p in str(layer).split("|")}  # type: ignore[attr-defined]


def test_every_root_module_is_in_the_core_contract() -> None:
    root_modules = {
        f"delayed_delivery.{p.stem}" for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}
    }
    root_modules |= _core_modules() & _subpackages()
    missing = root_modules - _core_modules()
    assert not missing, f"modules at the package root must be core (stdlib only) and listed in pyproject: {missing}"
    gone = _core_modules() - root_modules
    assert not gone, f"the core contract lists modules that do not exist: {gone}"


def _subpackages() -> set[str]:
    return {f"delayed_delivery.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}


def test_every_subpackage_is_a_layer() -> None:
    packages = _subpackages()
    assert packages, "no subpackages found"
    missing = packages - _layered_packages() - _core_modules()
    assert not missing, f"subpackages must be placed in the layers contract in pyproject: {missing}"


def test_no_stray_modules_outside_packages() -> None:
    for path in PACKAGE.rglob("*.py"):
        assert (path.parent / "__init__.py").exists(), f"{path} is not inside a package"


def test_the_core_has_no_import_cycles() -> None:
    """No two core modules import each other, directly or through others (settings and the wheel once did)."""
    import grimp

    graph = grimp.build_graph("delayed_delivery")
    core = {m for m in graph.modules if m.startswith(tuple(f"{c}." for c in _core_modules())) or m in _core_modules()}
    cycles = sorted(
        (a, b)
        for a in core
        for b in graph.find_modules_directly_imported_by(a)
        if b in core and graph.find_shortest_chain(importer=b, imported=a) is not None
    )
    assert not cycles, f"import cycles in the core: {cycles}"


def test_no_import_cycles_anywhere_in_the_package() -> None:
    """No two modules of the package import each other at run time, directly or through others (imports under
    ``TYPE_CHECKING`` only name types and are left out)."""
    import grimp

    graph = grimp.build_graph("delayed_delivery", exclude_type_checking_imports=True)
    cycles = sorted(
        (a, b)
        for a in graph.modules
        for b in graph.find_modules_directly_imported_by(a)
        if graph.find_shortest_chain(importer=b, imported=a) is not None
    )
    assert not cycles, f"import cycles: {cycles}"
