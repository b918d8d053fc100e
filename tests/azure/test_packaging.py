"""The packaged function app: built, installed into a clean virtual environment, fired once against Azurite."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.packaging import APP_FILES, build_function_app
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.model import DelayedMessage
from tests.azure.conftest import make_store, new_name
from tests.azure.harness import drain
from tests.fixtures.azurite import Azurite
from tests.fixtures.services import ROOT

pytestmark = pytest.mark.azurite

FIRE = """
import json, sys
import delayed_delivery
from azure.functions.timer import TimerRequest
import function_app
functions = {f.get_function_name(): f for f in function_app.app.get_functions()}
functions["dispatch_delayed_messages"].get_user_function()(TimerRequest(past_due=False))
summary = function_app.host().run(budget=0.5)
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
    assert not (package / "aws").exists() and not (package / "cli.py").exists() and not (package / "testing").exists()
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
    with pytest.raises(ConfigurationError, match="refusing"):
        build_function_app(ROOT / "functions" / "azure")


def test_refuses_to_overwrite_a_folder_that_is_not_an_earlier_build(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigurationError, match="not empty"):
        build_function_app(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    again = build_function_app(tmp_path / "app")
    build_function_app(again)  # rebuilding over an earlier build is fine
    assert (again / "function_app.py").is_file()
