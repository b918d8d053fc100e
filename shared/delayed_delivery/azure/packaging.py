"""Build a self-contained function-app folder, ready for ``func azure functionapp publish <app>``.

The folder holds ``function_app.py``, ``host.json``, ``requirements.txt`` and ``.funcignore`` from
``functions/azure/`` plus the ``delayed_delivery`` package (core and the Azure adapter only; the CLI,
demo, test suites and other clouds' adapters are left out), so ``import delayed_delivery`` works in
Azure exactly as in the repository. Needs a checkout of the repository (``functions/azure`` is not
part of the installed wheel).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import ConfigurationError

__all__ = ["APP_FILES", "build_function_app", "function_source_dir"]

#: Files copied from ``functions/azure``.
APP_FILES = ("function_app.py", "host.json", "requirements.txt", ".funcignore")
#: Parts of the package a deployed dispatcher never imports (plus every ``*cli.py``, which need typer).
_EXCLUDED = {"aws", "postgres", "pipelines", "testing", "demo.py", "__pycache__"}

_PACKAGE = Path(__file__).resolve().parents[1]


def function_source_dir() -> Path:
    """``functions/azure`` in the repository this package was loaded from."""
    candidate = _PACKAGE.parents[1] / "functions" / "azure"
    if not (candidate / "function_app.py").is_file():
        raise ConfigurationError(
            f"cannot find functions/azure next to {_PACKAGE}: build the function app from a repository checkout"
        )
    return candidate


def build_function_app(dest: Path | str, *, source: Path | None = None, clean: bool = True) -> Path:
    """Write the function-app folder to ``dest`` and return it."""
    out = Path(dest)
    src = source or function_source_dir()
    if out.resolve() in (src.resolve(), _PACKAGE.resolve()) or src.resolve() in out.resolve().parents:
        raise ConfigurationError(f"refusing to build into {out}: pick an empty output folder")
    if out.exists() and any(out.iterdir()):
        if not (out / "function_app.py").is_file():
            raise ConfigurationError(f"refusing to build into {out}: it is not empty and not an earlier build")
        if clean:
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in APP_FILES:
        shutil.copy2(src / name, out / name)
    shutil.copytree(
        _PACKAGE,
        out / "delayed_delivery",
        ignore=lambda folder, names: [n for n in names if n in _EXCLUDED or n.endswith(("cli.py", ".pyc"))],
    )
    return out
