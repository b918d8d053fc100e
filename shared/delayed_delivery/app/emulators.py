"""Local emulators for the demo and for trying things out: moto server (SQS) and Azurite (Table/Blob/Queue).

Both run on free loopback ports, with no telemetry and in-memory state, and stop with the context manager.
Where they come from: ``moto_server`` beside the running Python (``pip install 'moto[server]'``), and
Azurite from ``$DELAYED_DELIVERY_AZURITE`` (path to ``azurite.js``), ``./node_modules``, the source checkout's
``node_modules`` or ``azurite`` on PATH.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from delayed_delivery.errors import ConfigurationError

__all__ = ["AZURITE_ACCOUNT", "AZURITE_KEY", "Emulator", "LocalEmulators", "azurite_connection_string"]

#: Azurite's documented development account (public, not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_connection_string(blob_port: int, queue_port: int, table_port: int, host: str = "127.0.0.1") -> str:
    """Connection string for the development account on an Azurite at these ports."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://{host}:{blob_port}/{AZURITE_ACCOUNT};"
        f"QueueEndpoint=http://{host}:{queue_port}/{AZURITE_ACCOUNT};"
        f"TableEndpoint=http://{host}:{table_port}/{AZURITE_ACCOUNT};"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Emulator:
    """One emulator process and the ports it serves."""

    name: str
    argv: list[str]
    ports: list[int]
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(prefix="delayed-delivery-", suffix=".log")[1]))

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait until every port answers."""
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        pending = list(self.ports)
        while pending and time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            pending = [p for p in pending if not _listening(p)]
            if pending:
                time.sleep(0.1)
        if pending:
            self.stop()
            tail = self.log.read_text(errors="replace")[-2000:]
            raise ConfigurationError(f"{self.name} did not start (log {self.log}):\n{tail}")

    def stop(self) -> None:
        """Terminate, then kill if needed."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def _moto_argv(port: int) -> list[str]:
    exe = Path(sys.executable).parent / "moto_server"
    found = str(exe) if exe.exists() else shutil.which("moto_server")
    if not found:
        raise ConfigurationError("moto_server not found: pip install 'moto[server]' (make demo installs it)")
    return [found, "-H", "127.0.0.1", "-p", str(port)]


def _azurite_argv(blob: int, queue: int, table: int) -> list[str]:
    flags = ["--silent", "--disableTelemetry", "--skipApiVersionCheck", "--inMemoryPersistence"]
    for service, port in (("blob", blob), ("queue", queue), ("table", table)):
        flags += [f"--{service}Host", "127.0.0.1", f"--{service}Port", str(port)]
    relative = "node_modules/azurite/dist/src/azurite.js"
    checkout = Path(__file__).resolve().parents[3] / relative  # a source checkout (shared/delayed_delivery/app/)
    script = os.environ.get("DELAYED_DELIVERY_AZURITE") or str(Path.cwd() / relative)
    if not os.environ.get("DELAYED_DELIVERY_AZURITE") and not Path(script).exists() and checkout.exists():
        script = str(checkout)
    if Path(script).exists():
        node = shutil.which("node")
        if not node:
            raise ConfigurationError("Azurite needs Node.js: install node (make demo uses the machine's node)")
        return [node, script, *flags]
    binary = shutil.which("azurite")
    if binary:
        return [binary, *flags]
    raise ConfigurationError(
        "Azurite not found: run `npm install` in the project (package.json pins azurite 3.35.0), "
        "or set DELAYED_DELIVERY_AZURITE to azurite.js"
    )


class LocalEmulators:
    """Start moto server and/or Azurite on loopback (free ports unless given); stop them on exit."""

    def __init__(
        self,
        *,
        moto: bool = True,
        azurite: bool = True,
        moto_port: int | None = None,
        azurite_ports: tuple[int, int, int] | None = None,
    ) -> None:
        self.emulators: dict[str, Emulator] = {}
        if moto:
            port = moto_port or _free_port()
            self.emulators["moto"] = Emulator("moto server", _moto_argv(port), [port])
        if azurite:
            blob, queue, table = azurite_ports or (_free_port(), _free_port(), _free_port())
            self.emulators["azurite"] = Emulator("Azurite", _azurite_argv(blob, queue, table), [blob, queue, table])
        busy = [p for e in self.emulators.values() for p in e.ports if (moto_port or azurite_ports) and _listening(p)]
        if busy:
            raise ConfigurationError(
                f"port(s) {', '.join(map(str, busy))} already in use on 127.0.0.1 (emulators already running?)"
            )

    @property
    def sqs_endpoint(self) -> str:
        """The moto server URL."""
        return f"http://127.0.0.1:{self.emulators['moto'].ports[0]}"

    @property
    def azure_connection_string(self) -> str:
        """Connection string for Azurite's development account."""
        blob, queue, table = self.emulators["azurite"].ports
        return azurite_connection_string(blob, queue, table)

    def start(self) -> LocalEmulators:
        """Start every emulator (in parallel where possible)."""
        try:
            for emulator in self.emulators.values():
                emulator.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every emulator this object started."""
        for emulator in self.emulators.values():
            emulator.stop()

    def __enter__(self) -> LocalEmulators:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
