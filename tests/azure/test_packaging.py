"""The packaged function app: built, installed into a clean virtual environment, fired once against Azurite."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.assets import copy_asset, required_modules
from delayed_delivery.azure.packaging import APP_FILES, app_modules, build_function_app, function_source_dir
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.model import DelayedMessage
from tests.azure.conftest import make_store, new_name
from tests.azure.harness import drain
from tests.fixtures.azurite import Azurite
from tests.fixtures.services import ROOT
from tests.infra.test_assets import (
    assert_runtime_only,
    asset_module_names,
    files_under,
    graph_upstream,
    import_everything,
)

pytestmark = pytest.mark.azurite

FIRE = """
import json, sys
import delayed_delivery
from azure.functions.timer import TimerRequest
import function_app
from delayed_delivery.azure.function_host import host
functions = {f.get_function_name(): f for f in function_app.app.get_functions()}
functions["dispatch_delayed_messages"].get_user_function()(TimerRequest(past_due=False))
summary = host().run(budget=0.5)
try:
    import typer  # noqa: F401
    has_typer = True
except ImportError:
    has_typer = False
print(json.dumps({"package": delayed_delivery.__file__, "has_typer": has_typer, "enabled": summary.enabled}))
"""


def _install(venv: Path, requirements: Path) -> Path:
    python = venv / "bin" / "python"
    uv = shutil.which("uv")
    if uv:
        subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=120)
        env = {**os.environ, "VIRTUAL_ENV": str(venv)}
        subprocess.run([uv, "pip", "install", "-q", "-r", str(requirements)], check=True, timeout=600, env=env)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(requirements)], check=True, timeout=900)
    return python


def test_built_app_installs_cleanly_and_its_timer_dispatches_on_azurite(
    azurite: Azurite, queues: QueueServiceClient, tmp_path: Path
) -> None:
    app = build_function_app(tmp_path / "app")
    assert {p.name for p in app.iterdir()} == {*APP_FILES, "delayed_delivery"}
    package = app / "delayed_delivery"
    assert (package / "azure" / "table_store.py").is_file() and (package / "dispatcher.py").is_file()
    assert not (package / "aws").exists() and not (package / "app").exists() and not (package / "testing").exists()
    json.loads((app / "host.json").read_text())

    python = _install(tmp_path / "venv", app / "requirements.txt")
    table, queue = new_name(), new_name("q")
    queues.create_queue(queue)
    store = make_store(azurite.connection_string, table)
    store.store(DelayedMessage("packaged-1", queue, b"hi", datetime.now(UTC) - timedelta(seconds=1)))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING": azurite.connection_string,
        "DELAYED_DELIVERY_TABLE_NAME": table,
        "DELAYED_DELIVERY_CONTAINER_NAME": table,
        "DELAYED_DELIVERY_RUN_SECONDS": "2",
        "DELAYED_DELIVERY_LEASE_SECONDS": "15",
    }
    done = subprocess.run(
        [str(python), "-c", FIRE], cwd=app, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(result["package"]).is_relative_to(app), "the copied package is the one imported"
    assert result["has_typer"] is False, "the virtual environment is clean"
    assert result["enabled"] is True
    assert [e.message_id for e in drain(queues, queue)] == ["packaged-1"]
    assert store.count() == 0


def test_refuses_to_build_over_its_own_sources() -> None:
    for folder in (ROOT / "functions" / "azure", function_source_dir(), ROOT / "shared" / "delayed_delivery"):
        with pytest.raises(ConfigurationError, match="refusing"):
            build_function_app(folder)
    assert (ROOT / "functions" / "azure" / "function_app.py").is_file()


def test_refuses_to_overwrite_a_folder_that_is_not_an_earlier_build(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigurationError, match="not empty"):
        build_function_app(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    again = build_function_app(tmp_path / "app")
    build_function_app(again)  # rebuilding over an earlier build is fine
    assert (again / "function_app.py").is_file()


#: What the function app needs from PyPI: the Functions worker binding and the storage SDKs, nothing else.
RUNTIME_REQUIREMENTS = {
    "azure-functions",
    "azure-data-tables",
    "azure-storage-blob",
    "azure-storage-queue",
    "azure-identity",
    "azure-monitor-opentelemetry",
    "tzdata",
}


def _requirement_names(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower() for line in lines if line}


def _expected_files(package: Path, tmp_path: Path) -> list[str]:
    """The folder's files for ``package``: the app files at the root and what the entry point imports from it."""
    modules = required_modules([function_source_dir() / "function_app.py"], {"delayed_delivery": package})
    return sorted([*APP_FILES, *(p.as_posix() for p in copy_asset(modules, tmp_path / "expected"))])


#: Entry point of the function app as a module of the package (where the checkout keeps it).
ENTRY = "delayed_delivery.azure.app_files.function_app"


def test_built_app_holds_only_runtime_modules_and_runtime_requirements(tmp_path: Path) -> None:
    app = build_function_app(tmp_path / "app")
    assert files_under(app) == _expected_files(ROOT / "shared" / "delayed_delivery", tmp_path)
    held = asset_module_names(app)
    assert held == {*app_modules().modules, "function_app"}
    missing = graph_upstream([ENTRY], ("delayed_delivery",)) - {ENTRY} - held
    assert not missing, f"the function app lacks modules its entry point imports: {sorted(missing)}"
    for other in ("app", "testing", "aws", "postgres", "pipelines", "azure.app_files"):
        assert not [m for m in held if m.startswith(f"delayed_delivery.{other}")], other
    assert "delayed_delivery/data/measured.json" in files_under(app), "the core's data travels with it"
    assert_runtime_only(app)
    import_everything(app, sorted(held))  # every module's imports resolve inside the folder
    assert (app / "function_app.py").read_bytes() == (function_source_dir() / "function_app.py").read_bytes()
    assert _requirement_names(app / "requirements.txt") == RUNTIME_REQUIREMENTS


def _wheel(tmp_path: Path) -> Path:
    """A wheel of the project built from a copy of its sources (so the checkout gets no build/ or egg-info)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "shared", source / "shared", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path / "dist"
    uv = shutil.which("uv")
    if uv:
        command = [uv, "build", "--wheel", "-q", "-o", str(dist), str(source)]
    else:
        command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)]
    subprocess.run(command, check=True, timeout=300, cwd=tmp_path)
    [wheel] = dist.glob("delayed_delivery-*.whl")
    return wheel


def _install_wheel(venv: Path, wheel: Path) -> Path:
    """A clean virtual environment with only ``wheel`` installed (no index: the project has no dependencies)."""
    python = venv / "bin" / "python"
    uv = shutil.which("uv")
    if uv:
        subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=120)
        env = {**os.environ, "VIRTUAL_ENV": str(venv)}
        subprocess.run(
            [uv, "pip", "install", "-q", "--offline", "--no-deps", str(wheel)], check=True, timeout=300, env=env
        )
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        install = [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)]
        subprocess.run(install, check=True, timeout=300)
    return python


def test_an_installed_wheel_builds_the_function_app_outside_the_repository(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {f"delayed_delivery/azure/app_files/{name}" for name in APP_FILES} <= names, "the app files are package data"
    python = _install_wheel(tmp_path / "venv", wheel)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(python), "-m", "delayed_delivery.azure.packaging", "app"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    app = outside / "app"
    assert Path(done.stdout.strip()) == Path("app")
    installed = Path(purelib) / "delayed_delivery"
    assert files_under(app) == _expected_files(installed, tmp_path)
    assert files_under(app) == files_under(build_function_app(tmp_path / "from_checkout"))
    assert_runtime_only(app)
    assert _requirement_names(app / "requirements.txt") == RUNTIME_REQUIREMENTS
    imported = subprocess.run(
        [str(python), "-c", "import delayed_delivery.azure.packaging as p; print(p.__file__)"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert Path(imported).is_relative_to(installed), "the build ran from the installed wheel"
