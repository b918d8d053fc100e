"""Connections, identifier rules and error translation shared by the PostgreSQL adapter."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from ..errors import ConfigurationError, DelayedDeliveryError, InvalidMessageError, TransientError

__all__ = ["ConnectionSet", "derived_name", "same_database", "translate_error", "validate_identifier"]

#: Letters, digits, ``_``, ``-`` and ``.``; names are always quoted, so case and punctuation survive.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
#: PostgreSQL truncates identifiers longer than this many bytes (NAMEDATALEN - 1).
MAX_IDENTIFIER_BYTES = 63


def validate_identifier(kind: str, name: str) -> str:
    """Return ``name`` if it is a safe PostgreSQL identifier, else raise ``ConfigurationError``."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name) or len(name.encode()) > MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"invalid PostgreSQL {kind} name {name!r}: start with a letter or underscore, then use letters, "
            f"digits, '_', '-' or '.', up to {MAX_IDENTIFIER_BYTES} characters"
        )
    return name


def derived_name(base: str, suffix: str) -> str:
    """``base`` + ``suffix``, shortened with a hash when too long so distinct names never collide."""
    name = f"{base}{suffix}"
    if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    keep = MAX_IDENTIFIER_BYTES - len(suffix) - len(digest) - 1
    return f"{base[:keep]}_{digest}{suffix}"


def translate_error(exc: psycopg.Error, what: str) -> DelayedDeliveryError:
    """Map a psycopg error to the core hierarchy (retryability is the type)."""
    if isinstance(exc, pg_errors.UndefinedTable):
        return ConfigurationError(f"{what} does not exist: call setup_infrastructure() first ({exc})")
    if isinstance(exc, pg_errors.InsufficientPrivilege | pg_errors.InvalidAuthorizationSpecification):
        return ConfigurationError(f"not allowed to use {what}: {exc}")
    if isinstance(exc, pg_errors.DataError):
        return InvalidMessageError(f"PostgreSQL rejected a value for {what}: {exc}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return TransientError(f"PostgreSQL unavailable for {what}: {exc}")
    if isinstance(exc, psycopg.ProgrammingError):
        return ConfigurationError(f"PostgreSQL refused a statement on {what}: {exc}")
    return TransientError(f"PostgreSQL error on {what}: {exc}")


def same_database(a: str, b: str) -> bool:
    """True when two conninfo strings name the same host, port and database."""
    keys = ("host", "hostaddr", "port", "dbname")
    try:
        da, db = psycopg.conninfo.conninfo_to_dict(a), psycopg.conninfo.conninfo_to_dict(b)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"invalid PostgreSQL connection string: {exc}") from exc
    return all(str(da.get(k) or "") == str(db.get(k) or "") for k in keys)


class ConnectionSet:
    """One autocommit connection per thread, reopened after a failure; sessions run in UTC."""

    def __init__(
        self, conninfo: str, *, what: str, connect_timeout: float, statement_timeout: float, prepare: bool = True
    ) -> None:
        if not isinstance(conninfo, str) or not conninfo.strip():
            raise ConfigurationError("a PostgreSQL connection string (conninfo or postgresql:// URL) is required")
        try:
            psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(f"invalid PostgreSQL connection string: {exc}") from exc
        if connect_timeout <= 0 or statement_timeout <= 0:
            raise ConfigurationError("connect_timeout and statement_timeout must be positive seconds")
        self.conninfo = conninfo
        self.what = what
        self.connect_timeout = connect_timeout
        self.statement_timeout = statement_timeout
        self.prepare = prepare
        self._local = threading.local()
        self._all: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection (the caller owns it)."""
        try:
            conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=max(1, round(self.connect_timeout)))
            if not self.prepare:
                conn.prepare_threshold = None
            conn.execute("SET TIME ZONE 'UTC'")
            conn.execute(sql.SQL("SET statement_timeout = {}").format(int(self.statement_timeout * 1000)))
        except psycopg.Error as exc:
            raise translate_error(exc, self.what) from exc
        return conn

    def get(self) -> psycopg.Connection[Any]:
        """This thread's connection, opened on first use or after it broke."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = self.connect()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def ddl_cursor(self, schema: str, lock_name: str) -> Iterator[psycopg.Cursor[Any]]:
        """A transaction holding an advisory lock on ``lock_name``, with ``schema`` created if missing."""
        with self.cursor(transaction=True) as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_name,))
            if schema != "public":
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            yield cur

    @contextmanager
    def cursor(self, *, transaction: bool = False) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor on this thread's connection (optionally in one transaction), errors translated."""
        conn = self.get()
        try:
            if transaction:
                with conn.transaction(), conn.cursor() as cur:
                    yield cur
            else:
                with conn.cursor() as cur:
                    yield cur
        except psycopg.Error as exc:
            if conn.broken or conn.closed:
                self._forget(conn)
            raise translate_error(exc, self.what) from exc

    def _forget(self, conn: psycopg.Connection[Any]) -> None:
        self._local.conn = None
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        conn.close()

    def close(self) -> None:
        """Close every connection opened through this set."""
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()
