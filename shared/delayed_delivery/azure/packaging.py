"""Build a self-contained function-app folder, ready for ``func azure functionapp publish <app>``.

The folder holds ``function_app.py``, ``host.json``, ``requirements.txt`` and ``.funcignore`` (package data in
``delayed_delivery/azure/app_files``, so an installed package builds it as well as a checkout) plus the modules of
``delayed_delivery`` that ``function_app.py`` imports, found by the package's one packaging rule
(``delayed_delivery.assets``): never the applications (CLI, demo, emulators), the test tooling or the other
adapters. ``requirements.txt`` names only runtime dependencies.
``python -m delayed_delivery.azure.packaging <folder>`` builds it without the CLI.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from ..assets import AssetModules, copy_asset, required_modules
from ..errors import ConfigurationError

__all__ = ["APP_FILES", "ENTRY_POINT", "app_modules", "build_function_app", "function_source_dir", "main"]

#: Files copied from ``delayed_delivery/azure/app_files`` to the root of the folder.
APP_FILES = ("function_app.py", "host.json", "requirements.txt", ".funcignore")
#: The app's entry point among them: the Functions host imports it, and the folder holds what it imports.
ENTRY_POINT = "function_app.py"

_PACKAGE = Path(__file__).resolve().parents[1]


def function_source_dir() -> Path:
    """``delayed_delivery/azure/app_files``: the function-app files shipped with the package."""
    candidate = Path(__file__).resolve().parent / "app_files"
    missing = [name for name in APP_FILES if not (candidate / name).is_file()]
    if missing:
        raise ConfigurationError(f"the package at {_PACKAGE} lacks {', '.join(missing)} in {candidate}: reinstall it")
    return candidate


def app_modules(source: Path | None = None) -> AssetModules:
    """The package modules the function app needs: those its entry point imports, with their packages."""
    return required_modules([(source or function_source_dir()) / ENTRY_POINT], {"delayed_delivery": _PACKAGE})


def _is_earlier_build(folder: Path) -> bool:
    return (folder / "function_app.py").is_file() and (folder / "delayed_delivery" / "__init__.py").is_file()


def build_function_app(dest: Path | str, *, source: Path | None = None, clean: bool = True) -> Path:
    """Write the function-app folder to ``dest`` and return it."""
    out = Path(dest)
    src = source or function_source_dir()
    resolved = out.resolve()
    if resolved in (src.resolve(), _PACKAGE) or _PACKAGE in resolved.parents or src.resolve() in resolved.parents:
        raise ConfigurationError(f"refusing to build into {out}: pick an empty output folder")
    if out.exists() and any(out.iterdir()):
        if not _is_earlier_build(out):
            raise ConfigurationError(f"refusing to build into {out}: it is not empty and not an earlier build")
        if clean:
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in APP_FILES:
        shutil.copyfile(src / name, out / name)
    copy_asset(app_modules(src), out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m delayed_delivery.azure.packaging <folder>``: build the folder and print where it is."""
    parser = argparse.ArgumentParser(
        prog="python -m delayed_delivery.azure.packaging", description="Build the Azure function-app folder."
    )
    parser.add_argument("out", type=Path, help="output folder (created; an earlier build is replaced)")
    args = parser.parse_args(argv)
    try:
        folder = build_function_app(args.out)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
