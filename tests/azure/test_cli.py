"""The ``delayed-delivery azure`` commands against Azurite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from azure.storage.queue import QueueServiceClient
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite
runner = CliRunner()


def test_setup_send_and_dispatch(azurite: Azurite, queues: QueueServiceClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_STORAGE_CONNECTION_STRING", azurite.connection_string)
    monkeypatch.setenv("DELAYED_DELIVERY_ENDPOINT", new_name("endpoint"))
    monkeypatch.setenv("DELAYED_DELIVERY_LEASE_SECONDS", "15")
    queue = new_name("q")
    queues.create_queue(queue)
    assert runner.invoke(app, ["azure", "setup"]).exit_code == 0
    sent = runner.invoke(app, ["azure", "send", "-q", queue, "-d", "0s", "-b", "hello", "--cancellable"])
    assert sent.exit_code == 0, sent.output
    assert json.loads(sent.stdout)["route"] == "table"
    done = runner.invoke(app, ["azure", "dispatch", "--seconds", "1.5"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["dispatched"] == 1
    assert [e.body for e in drain(queues, queue)] == [b"hello"]


def test_user_mistakes_exit_2_with_one_line(azurite: Azurite, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_STORAGE_CONNECTION_STRING", azurite.connection_string)
    bad = runner.invoke(app, ["azure", "send", "-q", "Bad_Queue", "-d", "1s", "--endpoint", "orders"])
    assert bad.exit_code == 2 and "invalid Azure queue name" in bad.output
    (tmp_path / "keep.txt").write_text("x")
    assert runner.invoke(app, ["azure", "package", str(tmp_path)]).exit_code == 2
    built = runner.invoke(app, ["azure", "package", str(tmp_path / "app")])
    assert built.exit_code == 0 and (tmp_path / "app" / "function_app.py").is_file()
