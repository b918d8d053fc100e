"""``local up``: both emulators on the given ports, connection settings printed, stopped afterwards."""

from __future__ import annotations

import json
import socket

import pytest

from tests.cli.conftest import one_line_error, run
from tests.fixtures.services import free_port

pytestmark = [pytest.mark.moto, pytest.mark.azurite]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _three_free_ports() -> int:
    for _ in range(20):
        base = free_port()
        if base < 65000 and not any(_listening(base + i) for i in (1, 2)):
            return base
    pytest.skip("no three consecutive free ports")


def test_local_up_serves_on_the_given_ports_then_stops() -> None:
    azurite = _three_free_ports()
    moto = free_port()
    while azurite <= moto <= azurite + 2:
        moto = free_port()
    result = run("local", "up", "--moto-port", str(moto), "--azurite-port", str(azurite), "--for", "0.5", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["AWS_ENDPOINT_URL_SQS"] == f"http://127.0.0.1:{moto}"
    assert f"TableEndpoint=http://127.0.0.1:{azurite + 2}/" in data["DELAYED_DELIVERY_STORAGE_CONNECTION_STRING"]
    assert not _listening(moto) and not _listening(azurite)


def test_local_up_refuses_a_busy_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        one_line_error(run("local", "up", "--moto-port", str(port), "--for", "0"), str(port), "already in use")
