"""Prepare the Lambda functions' code assets offline (no Docker): plain folders the Lambda zips are made from.

One asset per construct, each holding its entry points (``functions/aws/…``, the modules the handlers name) and
the ``delayed_delivery`` modules they import, found by the package's one packaging rule
(``delayed_delivery.assets``): no applications, test tooling or other adapters, and no module the functions never
import. boto3 comes with the Lambda runtime and Powertools with its public layer, so no third-party code is
copied, with one exception: an asset holding the schedules' zone loader also holds the ``tzdata`` package installed
here (the version uv.lock pins), so a Lambda evaluates schedules with the same IANA release as the function app,
whatever the runtime image carries. The folders are rebuilt on every synth from the repository, so an asset's hash
changes exactly when the code it holds does.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from delayed_delivery.assets import AssetModules, copy_asset, required_modules

__all__ = ["DATA_PACKAGES", "PACKAGES", "REPO_ROOT", "entry_module", "function_modules", "prepare_function_asset"]

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The packages an asset's modules come from: the library and the thin entry points.
PACKAGES = {"delayed_delivery": REPO_ROOT / "shared" / "delayed_delivery", "functions": REPO_ROOT / "functions"}
#: Third-party data packages a module reads through ``importlib.resources`` (no import statement shows them).
DATA_PACKAGES = {"delayed_delivery.schedules.zones": ("tzdata",)}


def entry_module(handler: str) -> str:
    """The module a Lambda handler string names: ``functions.aws.requeue.handler`` -> ``functions.aws.requeue``."""
    module, _, function = handler.rpartition(".")
    if not module or not function:
        raise ValueError(f"a Lambda handler is <module>.<function>, not {handler!r}")
    return module


def function_modules(handlers: Sequence[str]) -> AssetModules:
    """The modules an asset serving ``handlers`` holds: their entry points and what those import."""
    if not handlers:
        raise ValueError("an asset serves at least one handler")
    return required_modules([entry_module(h) for h in handlers], PACKAGES)


def prepare_function_asset(handlers: Sequence[str], destination: Path) -> Path:
    """Write the asset serving ``handlers`` into ``destination`` (replaced if it differs) and return it.

    The folder is built beside ``destination`` and renamed into place, so two synths at once (test workers, two
    shells) never see a half-written asset: the first rename wins and an identical second build is dropped.
    """
    modules = function_modules(handlers)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    staging.chmod(0o755)  # as a plain mkdir would make it: the Lambda runtime reads the unzipped folder
    try:
        copy_asset(modules, staging)
        for module, packages in DATA_PACKAGES.items():
            if module in modules.modules:
                for package in packages:
                    _copy_installed(package, staging)
        _move_into_place(staging, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return destination


def _move_into_place(staging: Path, destination: Path) -> None:
    """Rename ``staging`` to ``destination``, unless an identical folder is there already; an old one is replaced."""
    for _ in range(5):
        try:
            staging.rename(destination)
            return
        except OSError:
            if not destination.exists():
                continue  # another synth moved the old folder aside just now: try again
        if _digest(destination) == _digest(staging):
            return
        retired = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old.", dir=destination.parent))
        with contextlib.suppress(FileNotFoundError):  # another synth replaced it first
            destination.rename(retired / destination.name)
        shutil.rmtree(retired, ignore_errors=True)
    raise RuntimeError(f"could not put the asset in place at {destination}: other synths keep replacing it")


def _digest(folder: Path) -> str:
    """A hash of every file's relative path and bytes under ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _copy_installed(package: str, destination: Path) -> None:
    """Copy the installed ``package`` (a folder of data and ``__init__`` files) into the asset, caches left out."""
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {package} package is not installed here: run scripts/bootstrap.sh")
    source = Path(next(iter(spec.submodule_search_locations)))
    shutil.copytree(source, destination / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
