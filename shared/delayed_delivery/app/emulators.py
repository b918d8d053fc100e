"""Local emulators for the demo and for trying things out: moto server (SQS) and Azurite (Table/Blob/Queue).

Both run on free loopback ports, with no telemetry and in-memory state, and stop with the context manager.
Where they come from: ``moto_server`` beside the running Python (the ``local`` extra brings ``moto[server]``), and
Azurite from ``$DELAYED_DELIVERY_AZURITE`` (path to ``azurite.js``), ``./node_modules``, the source checkout's
``node_modules``, ``azurite`` on PATH, or the user cache (``~/.cache/delayed-delivery/azurite-<version>``, or under
``$XDG_CACHE_HOME``), where it is installed with npm the first time it is needed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from delayed_delivery.errors import ConfigurationError, extra_missing

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "AZURITE_VERSION",
    "Emulator",
    "LocalEmulators",
    "azurite_cache",
    "azurite_connection_string",
    "find_azurite",
]

#: Azurite's documented development account (public, not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
#: The Azurite release installed into the user cache (package.json pins the same for a source checkout).
AZURITE_VERSION = "3.35.0"
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
        raise extra_missing("moto server (the local SQS, S3 and DynamoDB)", "cli", "local")
    return [found, "-H", "127.0.0.1", "-p", str(port)]


_AZURITE_JS = Path("node_modules/azurite/dist/src/azurite.js")
#: A source checkout's root (its ``node_modules`` has Azurite after ``make bootstrap``), wherever the command runs.
_CHECKOUT = Path(__file__).resolve().parents[3]


def azurite_cache() -> Path:
    """The folder Azurite is installed into for a pip user: ``$XDG_CACHE_HOME`` or ``~/.cache``, per version."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "delayed-delivery" / f"azurite-{AZURITE_VERSION}"


def find_azurite() -> list[str] | None:
    """The command that starts Azurite (before its flags), or ``None`` when it is not installed anywhere we look."""
    configured = os.environ.get("DELAYED_DELIVERY_AZURITE")
    if configured:
        if not Path(configured).exists():
            raise ConfigurationError(
                f"DELAYED_DELIVERY_AZURITE={configured!r} does not exist: point it at azurite.js, or unset it to have "
                "Azurite installed into the user cache with npm"
            )
        return [_node(), configured]
    for script in (Path.cwd() / _AZURITE_JS, _CHECKOUT / _AZURITE_JS):
        if script.exists():
            return [_node(), str(script)]
    binary = shutil.which("azurite")
    if binary:
        return [binary]
    cached = azurite_cache() / _AZURITE_JS
    return [_node(), str(cached)] if cached.exists() else None


def _node() -> str:
    node = shutil.which("node")
    if not node:
        raise ConfigurationError("Azurite needs Node.js 18 or later: install node (Debian: apt-get install nodejs)")
    return node


def install_azurite(status: Callable[[str], None]) -> list[str]:
    """Install Azurite into the user cache with npm (once); the command that starts it."""
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigurationError(
            "Azurite (the Azure Storage emulator) is not installed and npm is missing to install it: install Node.js "
            "18 or later with npm (Debian: apt-get install nodejs npm) and run this again, or install Azurite "
            "yourself (npm install -g azurite) or set DELAYED_DELIVERY_AZURITE to its azurite.js"
        )
    node, target = _node(), azurite_cache()
    status(f"Azurite not found: installing azurite@{AZURITE_VERSION} with npm into {target} (once, about a minute)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        argv = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--no-save", "--loglevel=error"]
        done = subprocess.run(
            [*argv, f"azurite@{AZURITE_VERSION}"], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
        )
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise ConfigurationError(f"npm could not install azurite@{AZURITE_VERSION} ({done.returncode}): {tail}")
        if not target.exists():
            staging.rename(target)  # whole or not at all: a killed install leaves only a hidden staging folder
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [node, str(target / _AZURITE_JS)]


def _azurite_argv(blob: int, queue: int, table: int, status: Callable[[str], None]) -> list[str]:
    flags = ["--silent", "--disableTelemetry", "--skipApiVersionCheck", "--inMemoryPersistence"]
    for service, port in (("blob", blob), ("queue", queue), ("table", table)):
        flags += [f"--{service}Host", "127.0.0.1", f"--{service}Port", str(port)]
    command = find_azurite() or install_azurite(status)
    return [*command, *flags]


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class LocalEmulators:
    """Start moto server and/or Azurite on loopback (free ports unless given); stop them on exit."""

    def __init__(
        self,
        *,
        moto: bool = True,
        azurite: bool = True,
        moto_port: int | None = None,
        azurite_ports: tuple[int, int, int] | None = None,
        status: Callable[[str], None] = _to_stderr,
    ) -> None:
        self.emulators: dict[str, Emulator] = {}
        if moto:
            port = moto_port or _free_port()
            self.emulators["moto"] = Emulator("moto server", _moto_argv(port), [port])
        if azurite:
            blob, queue, table = azurite_ports or (_free_port(), _free_port(), _free_port())
            self.emulators["azurite"] = Emulator(
                "Azurite", _azurite_argv(blob, queue, table, status), [blob, queue, table]
            )
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
