"""Prepare the requeue function's code asset offline (no Docker): a plain folder the Lambda zip is made from.

It holds ``delayed_delivery`` (the stdlib core and the ``aws`` adapter; not the applications (CLI, demo,
emulators), the Azure, PostgreSQL or Spark adapters, or the test tooling) and ``functions/aws``. boto3 comes
with the Lambda runtime and Powertools with its public layer, so no third-party code is copied. The folder is
rebuilt on every synth from the repository, so the asset hash changes exactly when the function's code does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["REPO_ROOT", "SKIP_PACKAGES", "prepare_function_asset"]

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Subpackages of ``delayed_delivery`` the requeue function never imports.
SKIP_PACKAGES = frozenset({"app", "azure", "postgres", "pipelines", "testing"})
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".mypy_cache")


def prepare_function_asset(destination: Path | None = None) -> Path:
    """Copy the function's sources into ``destination`` (default ``build/aws/requeue``) and return it."""
    target = destination or REPO_ROOT / "build" / "aws" / "requeue"
    if target.exists():
        shutil.rmtree(target)
    package = REPO_ROOT / "shared" / "delayed_delivery"
    shutil.copytree(
        package,
        target / "delayed_delivery",
        ignore=lambda folder, names: {
            *_IGNORE(folder, names),
            *(n for n in names if Path(folder) == package and n in SKIP_PACKAGES),
        },
    )
    (target / "functions").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "functions" / "__init__.py", target / "functions" / "__init__.py")
    shutil.copytree(REPO_ROOT / "functions" / "aws", target / "functions" / "aws", ignore=_IGNORE)
    return target
