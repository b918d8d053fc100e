"""``local up``: both emulators on the given ports, connection settings printed, stopped afterwards (also when
``local up`` itself is stopped by SIGTERM or Ctrl-C)."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.app.cli.conftest import one_line_error, run
from tests.fixtures.processes import descendants, kill_tree

pytestmark = [pytest.mark.moto, pytest.mark.azurite]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return not _listening(port)


def _ports() -> tuple[int, int]:
    """(moto, Azurite's first of three): free ports below the kernel's ephemeral range, so that no outgoing
    connection of a test running beside this one takes them before the emulators bind them."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 32_000, 4)
        if all(_bindable(base + i) for i in range(4)):
            return base + 3, base
    pytest.skip("no four consecutive free ports below 32000")


def test_local_up_serves_on_the_given_ports_then_stops() -> None:
    moto, azurite = _ports()
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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_local_up_stops_its_emulators_on_a_signal(signum: signal.Signals) -> None:
    moto, azurite = _ports()
    command = [str(Path(sys.executable).parent / "delayed-delivery"), "local", "up"]
    proc = subprocess.Popen(
        [*command, "--moto-port", str(moto), "--azurite-port", str(azurite)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        while not (_listening(moto) and _listening(azurite + 2)) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        emulators = descendants(proc.pid)
        assert len(emulators) >= 2, emulators
        proc.send_signal(signum)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    still = [pid for pid in emulators if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
    for pid in still:  # never leave them behind, even when the test fails
        kill_tree(pid)
    assert code == 0 and not still, f"exit code {code}, left running: {still}"
    assert not _listening(moto) and not _listening(azurite) and not _listening(azurite + 2)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
