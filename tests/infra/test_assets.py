"""The one packaging rule (``delayed_delivery.assets``): a deploy asset holds its entry points and the modules they
import, found statically, and nothing else: no CLI, demo, emulator or test code, no other adapter, nothing that
imports typer or rich. Checked on hand-made packages, on each Lambda asset (against grimp's import graph and by
importing every module from the asset alone), and on the synthesized stacks (each function's handler is in the
asset its code comes from)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import grimp
import pytest

from delayed_delivery.assets import AssetModules, copy_asset, required_modules
from infra.aws.packaging import (
    DATA_PACKAGES,
    PACKAGES,
    REPO_ROOT,
    entry_module,
    function_modules,
    prepare_function_asset,
)
from infra.aws.stack import ASSETS

PACKAGE = REPO_ROOT / "shared" / "delayed_delivery"
#: Names a runtime asset never holds (the applications, the test tooling).
FORBIDDEN_PART = re.compile(r"^(app|testing|tests)$|(^|_)(cli|demo|emulators?)($|_)")
#: The CLI libraries, imported anywhere in a file.
CLI_IMPORT = re.compile(r"^\s*(import|from)\s+(typer|rich)\b", re.MULTILINE)
#: Subpackages of ``delayed_delivery`` no Lambda function imports.
NOT_FOR_LAMBDA = ("app", "testing", "azure", "postgres", "pipelines")


def files_under(root: Path) -> list[str]:
    """Every file below ``root`` as a sorted relative POSIX path, caches left out."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )


def assert_runtime_only(root: Path) -> None:
    """No path part names an application or test module, and no Python file imports typer or rich."""
    for rel in files_under(root):
        parts = Path(rel).with_suffix("").parts
        bad = [part for part in parts if FORBIDDEN_PART.search(part)]
        assert not bad, f"{rel} is application or test code"
        if rel.endswith(".py"):
            assert not CLI_IMPORT.search((root / rel).read_text(encoding="utf-8")), f"{rel} imports typer or rich"


def asset_module_names(root: Path) -> set[str]:
    """The Python modules a folder holds, by import name (``pkg/__init__.py`` -> ``pkg``), the data packages copied
    whole (``DATA_PACKAGES``: tzdata) left out."""
    data = {package for packages in DATA_PACKAGES.values() for package in packages}
    names = set()
    for rel in files_under(root):
        if rel.endswith(".py") and Path(rel).parts[0] not in data:
            parts = Path(rel).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@cache
def _graph(*packages: str) -> Any:
    return grimp.build_graph(*packages, exclude_type_checking_imports=True, cache_dir=None)  # no stale cache


def graph_upstream(entries: list[str], packages: tuple[str, ...]) -> set[str]:
    """What grimp (import-linter's import graph, built independently of the rule) says ``entries`` import."""
    graph = _graph(*packages)
    found = set(entries)
    for entry in entries:
        found |= graph.find_upstream_modules(entry)
    return found


def import_everything(asset: Path, modules: list[str]) -> None:
    """Import every module in a fresh interpreter that finds the package only in ``asset``."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n    importlib.import_module(name)\n"
        "import delayed_delivery\n"
        "print(json.dumps({'package': delayed_delivery.__file__}))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "POWERTOOLS_TRACE_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=asset, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    package = json.loads(done.stdout.strip().splitlines()[-1])["package"]
    assert Path(package).is_relative_to(asset), "the asset's own copy is the one imported"


# --- the rule, on hand-made packages ---------------------------------------------------------------------------


def _tree(root: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def toy(tmp_path: Path) -> dict[str, Path]:
    """A package ``pkg`` with a lazy subpackage, a TYPE_CHECKING import, data files, and modules nobody imports."""
    _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from .core import thing\n",
            "pkg/core.py": "import json\nimport boto3\n",
            "pkg/py.typed": "",
            "pkg/data/figures.json": "{}",
            "pkg/unused.py": "import pkg.app\n",
            "pkg/app/__init__.py": "",
            "pkg/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import unused\n",
            "pkg/late.py": "def f():\n    from .helpers.deep import x\n",
            "pkg/helpers/__init__.py": "",
            "pkg/helpers/deep.py": "x = 1\n",
            "pkg/helpers/notes.txt": "kept: data of an included package",
            "pkg/lazy/__init__.py": (
                "from . import always\n"
                "def __getattr__(name):\n    if name == 'Sender':\n        from .sender import Sender\n"
                "        return Sender\n    raise AttributeError(name)\n"
            ),
            "pkg/lazy/always.py": "",
            "pkg/lazy/sender.py": "from ..helpers import deep\nclass Sender: ...\n",
            "pkg/lazy/receive.py": "from pkg.core import thing\n",
            "pkg/uses_lazy_name.py": "from pkg.lazy import Sender\n",
            "pkg/uses_submodule.py": "from pkg.lazy import receive\n",
        },
    )
    return {"pkg": tmp_path / "pkg"}


def _names(modules: AssetModules) -> set[str]:
    return set(modules.modules)


def test_entries_their_imports_and_their_packages_nothing_else(toy: dict[str, Path]) -> None:
    found = _names(required_modules(["pkg.typed", "pkg.late"], toy))
    assert found == {"pkg", "pkg.core", "pkg.typed", "pkg.late", "pkg.helpers", "pkg.helpers.deep"}


def test_a_lazy_name_counts_only_where_it_is_imported(toy: dict[str, Path]) -> None:
    submodule = _names(required_modules(["pkg.uses_submodule"], toy))
    assert {"pkg.lazy", "pkg.lazy.always", "pkg.lazy.receive"} <= submodule
    assert "pkg.lazy.sender" not in submodule, "importing a submodule does not run the package's __getattr__"
    name = _names(required_modules(["pkg.uses_lazy_name"], toy))
    assert {"pkg.lazy.sender", "pkg.helpers.deep"} <= name


def test_a_script_entry_brings_its_imports_but_is_not_itself_a_module(toy: dict[str, Path], tmp_path: Path) -> None:
    script = _tree(tmp_path / "app_files", {"function_app.py": "import os\nfrom pkg.lazy.receive import x\n"})
    found = _names(required_modules([script / "function_app.py"], toy))
    assert found == {"pkg", "pkg.core", "pkg.lazy", "pkg.lazy.always", "pkg.lazy.receive"}


def test_the_copy_holds_the_modules_and_their_packages_data(toy: dict[str, Path], tmp_path: Path) -> None:
    modules = required_modules(["pkg.late"], toy)
    written = copy_asset(modules, tmp_path / "out")
    assert [p.as_posix() for p in written] == files_under(tmp_path / "out")
    assert files_under(tmp_path / "out") == [
        "pkg/__init__.py",
        "pkg/core.py",
        "pkg/data/figures.json",
        "pkg/helpers/__init__.py",
        "pkg/helpers/deep.py",
        "pkg/helpers/notes.txt",
        "pkg/late.py",
        "pkg/py.typed",
    ]
    assert modules.lines() == sum(len(p.read_text().splitlines()) for p in modules.modules.values())


def test_an_entry_that_is_no_module_is_refused(toy: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="not a module"):
        required_modules(["pkg.missing"], toy)
    with pytest.raises(ValueError, match=r"<module>\.<function>"):
        entry_module("handler")


# --- the Lambda assets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("asset", sorted(ASSETS))
def test_each_lambda_asset_holds_exactly_what_its_handlers_import(asset: str, tmp_path: Path) -> None:
    handlers = ASSETS[asset]
    entries = [entry_module(h) for h in handlers]
    folder = prepare_function_asset(handlers, tmp_path / asset)
    held = asset_module_names(folder)
    assert held == set(function_modules(handlers).modules)
    missing = graph_upstream(entries, ("delayed_delivery", "functions")) - held
    assert not missing, f"the {asset} asset lacks modules its entry points import: {sorted(missing)}"
    for entry in entries:
        assert f"{entry.replace('.', '/')}.py" in files_under(folder)
    assert not [m for m in held if m.split(".")[:2] in (["delayed_delivery", p] for p in NOT_FOR_LAMBDA)]
    assert "delayed_delivery/data/measured.json" in files_under(folder), "the core's data travels with it"
    assert_runtime_only(folder)
    import_everything(folder, sorted(held))  # every module's imports resolve inside the asset


def test_no_lambda_asset_holds_another_functions_entry_point(tmp_path: Path) -> None:
    for asset, handlers in ASSETS.items():
        held = asset_module_names(prepare_function_asset(handlers, tmp_path / asset))
        others = {entry_module(h) for name, hs in ASSETS.items() if name != asset for h in hs}
        assert not held & others, asset


#: One synth's asset step in a process of its own (as two test workers or two shells run them), three times over.
#: The handlers come as arguments: the asset step alone, without importing the CDK (seconds of CPU per process).
_SYNTH = """
import sys
from pathlib import Path
from infra.aws.packaging import prepare_function_asset
for _ in range(3):
    assert prepare_function_asset(tuple(sys.argv[2:]), Path(sys.argv[1])).is_dir()
"""


def test_synths_at_once_never_see_a_half_written_asset(tmp_path: Path) -> None:
    """Test workers synthesize into one build folder at the same time: every call returns a whole asset."""
    handlers = ASSETS["requeue"]
    destination = tmp_path / "requeue"
    stale = destination / "delayed_delivery" / "stale.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("# from an older synth\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "shared")])}
    synths = [
        subprocess.Popen(
            [sys.executable, "-c", _SYNTH, str(destination), *handlers], env=env, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    failures = [err for p in synths if (err := p.communicate(timeout=600)[1]) and p.returncode != 0]
    assert not failures, failures
    assert asset_module_names(destination) == set(function_modules(handlers).modules)
    assert not stale.exists(), "an older asset is replaced, not merged"
    assert [p.name for p in tmp_path.iterdir()] == ["requeue"], "no staging or retired folder is left behind"
    assert destination.stat().st_mode & 0o777 == 0o755


def test_the_requeue_asset_carries_no_tier_and_the_tier_no_requeue(tmp_path: Path) -> None:
    requeue = set(function_modules(ASSETS["requeue"]).modules)
    tier = set(function_modules(ASSETS["tier"]).modules)
    assert not {m for m in requeue if m.startswith("delayed_delivery.aws.tier")}
    assert not {m for m in tier if m.startswith("delayed_delivery.aws.requeue")}


def test_the_packages_are_the_library_and_the_entry_points() -> None:
    assert PACKAGES == {"delayed_delivery": PACKAGE, "functions": REPO_ROOT / "functions"}


def assert_functions_use_their_assets(raw: dict[str, Any], template: Path) -> None:
    """Every function of the synthesized stack runs a handler whose module is in the asset its code comes from,
    and that asset holds exactly what the handlers using it import."""
    users: dict[Path, set[str]] = {}
    for resource in raw["Resources"].values():
        if resource["Type"] != "AWS::Lambda::Function":
            continue
        handler = resource["Properties"]["Handler"]
        if not handler.startswith("functions."):
            continue  # a CDK-provided function (custom resources)
        key = resource["Properties"]["Code"]["S3Key"]
        users.setdefault(template.parent / f"asset.{key.removesuffix('.zip')}", set()).add(handler)
    assert users, "no function of ours in the template"
    for folder, handlers in users.items():
        assert folder.is_dir(), folder
        [asset] = [name for name, served in ASSETS.items() if handlers <= set(served)]
        assert asset_module_names(folder) == set(function_modules(ASSETS[asset]).modules), asset
