"""A throwaway local PostgreSQL cluster (tests, benchmarks, demos): ``initdb`` + ``postgres`` on loopback.

Uses Debian's ``postgresql`` package binaries (``/usr/lib/postgresql/<version>/bin``) or ones on
``PATH``. PostgreSQL refuses to run as root, so as root the cluster runs as the ``postgres``
system user. Durability is switched off (``fsync=off``): never keep data in such a cluster.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigurationError

__all__ = ["ThrowawayCluster", "find_bindir"]


def find_bindir() -> Path | None:
    """Directory holding ``initdb`` and ``postgres``: the newest Debian install, else ``PATH``."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "postgres").exists():
            return bindir
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class ThrowawayCluster:
    """A cluster in a temporary directory; ``init()`` then ``argv`` (or ``start()``), and ``stop()``."""

    port: int = field(default_factory=_free_port)
    bindir: Path | None = field(default_factory=find_bindir)
    max_connections: int = 100
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dd-postgres-")))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def datadir(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    @property
    def socketdir(self) -> Path:
        """Where the Unix socket lives (kept out of /var/run)."""
        return self.root / "sock"

    @property
    def conninfo(self) -> str:
        """libpq connection string for the ``postgres`` database as superuser ``postgres``."""
        return f"host=127.0.0.1 port={self.port} dbname=postgres user=postgres"

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        runuser = shutil.which("runuser")
        if runuser is None:
            raise ConfigurationError("running as root needs runuser to start PostgreSQL as the postgres user")
        return [runuser, "-u", "postgres", "--", *argv]

    def init(self) -> None:
        """Create the data directory with ``initdb`` (trust auth on loopback only)."""
        if self.bindir is None:
            raise ConfigurationError("PostgreSQL server binaries not found (install the postgresql package)")
        self.socketdir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.socketdir, "postgres")
        argv = [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust"]
        argv += ["-E", "UTF8", "--locale=C", "--no-sync"]
        done = subprocess.run(self._as_owner(argv), capture_output=True, check=False)
        if done.returncode != 0:
            raise ConfigurationError(f"initdb failed: {done.stderr.decode(errors='replace')[-2000:]}")

    @property
    def argv(self) -> list[str]:
        """Command line running the server in the foreground."""
        assert self.bindir is not None
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.socketdir),
            "max_connections": str(self.max_connections),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
        }
        argv = [str(self.bindir / "postgres"), "-D", str(self.datadir), "-p", str(self.port)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        return self._as_owner(argv)

    def start(self, timeout: float = 30.0) -> ThrowawayCluster:
        """``init()`` and start the server; wait until it accepts connections."""
        self.init()
        log = (self.root / "server.log").open("wb")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigurationError(f"PostgreSQL exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        try:
            return self.wait_ready(max(1.0, deadline - time.monotonic()))
        except ConfigurationError:
            self.stop()
            raise

    def wait_ready(self, timeout: float = 30.0) -> ThrowawayCluster:
        """Wait until the server accepts connections (the port opens while it is still starting up)."""
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.conninfo, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                return self
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise ConfigurationError(
                        f"PostgreSQL on port {self.port} is not accepting connections: {exc}"
                    ) from exc
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server at once (``pg_ctl stop -m immediate``) and delete its files."""
        if self.bindir is not None and (self.datadir / "postmaster.pid").exists():
            pg_ctl = [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "stop", "-m", "immediate", "-w"]
            subprocess.run(self._as_owner(pg_ctl), capture_output=True, check=False, timeout=60)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)
