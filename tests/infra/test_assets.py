"""The Lambda asset holds only runtime code: the core, the AWS adapter and the Lambda entry, no CLI, demo,
emulator or test code and nothing that imports typer or rich."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.aws.packaging import REPO_ROOT, SKIP_PACKAGES, prepare_function_asset

PACKAGE = REPO_ROOT / "shared" / "delayed_delivery"
#: Names a runtime asset never holds (the applications, the test tooling).
FORBIDDEN_PART = re.compile(r"^(app|testing|tests)$|(^|_)(cli|demo|emulators?)($|_)")
#: The CLI libraries, imported anywhere in a file.
CLI_IMPORT = re.compile(r"^\s*(import|from)\s+(typer|rich)\b", re.MULTILINE)


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


def test_lambda_asset_is_exactly_the_core_the_aws_adapter_and_the_entry(tmp_path: Path) -> None:
    asset = prepare_function_asset(tmp_path / "asset")
    package = [f for f in files_under(PACKAGE) if f.split("/", 1)[0] not in SKIP_PACKAGES]
    entry = ["functions/__init__.py", *(f"functions/aws/{f}" for f in files_under(REPO_ROOT / "functions" / "aws"))]
    assert files_under(asset) == sorted([*(f"delayed_delivery/{f}" for f in package), *entry])
    assert {"app", "testing", "azure", "postgres", "pipelines"} <= SKIP_PACKAGES
    for needed in (
        "delayed_delivery/__init__.py",
        "delayed_delivery/aws/requeue/handler.py",
        "delayed_delivery/planning.py",
        "functions/aws/requeue.py",
        "functions/aws/bucket_ingest.py",  # the time-bucket tier's two entry points and their package
        "functions/aws/bucket_timer.py",
        "delayed_delivery/aws/tier/ingest_handler.py",
        "delayed_delivery/aws/tier/timer_handler.py",
    ):
        assert needed in files_under(asset)
    assert_runtime_only(asset)


def test_the_runtime_check_catches_application_code(tmp_path: Path) -> None:
    app = tmp_path / "with_app"
    (app / "delayed_delivery" / "app" / "cli").mkdir(parents=True)
    (app / "delayed_delivery" / "app" / "cli" / "__init__.py").write_text("")
    with pytest.raises(AssertionError, match="application or test code"):
        assert_runtime_only(app)
    rich = tmp_path / "with_rich"
    rich.mkdir()
    (rich / "tool.py").write_text("import json\nfrom rich.console import Console\n")
    with pytest.raises(AssertionError, match="imports typer or rich"):
        assert_runtime_only(rich)
    fine = tmp_path / "fine"
    fine.mkdir()
    (fine / "client.py").write_text("import json\n")
    assert_runtime_only(fine)
