"""Schedules in a SQLite table (default ``delayed_schedules``), beside the delayed messages in the same file.

Each call opens its own connection (``BEGIN IMMEDIATE`` for writes, so processes serialise), which suits a
materializer pass a minute; the conditional write is ``UPDATE … WHERE version = ?``. Columns keep what a query
needs (state, ``next_at_us`` indexed, cursor, version, counters); the definition is its JSON document
(``ScheduleDefinition.document``), read back by ``definition_from_document`` whatever version wrote it.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from ..clock import utc
from ..errors import ConfigurationError, TransientError
from ..model import Headers
from .model import MessageTemplate, Schedule, ScheduleState, columns, definition_from_document
from .ports import ScheduleExistsError, ScheduleStore

__all__ = ["SqliteScheduleStore"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIELDS = (
    "schedule_id, definition, destination, body, headers, state, cursor_us, next_at_us, version, fired, missed,"
    " skipped_paused, paused_at_us, last_fired_us"
)


def _us(value: datetime | None) -> int | None:
    if value is None:
        return None
    delta = utc(value) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _time(value: Any) -> datetime | None:
    return None if value is None else _EPOCH + timedelta(microseconds=int(value))


class SqliteScheduleStore(ScheduleStore):
    """A ``ScheduleStore`` in the SQLite file at ``path``."""

    def __init__(self, path: str | os.PathLike[str], *, table: str = "delayed_schedules", busy_timeout: float = 30.0):
        if not _NAME.match(table):
            raise ConfigurationError(f"invalid SQLite table name {table!r}: letters, digits and underscores, up to 63")
        self.path = os.fspath(path)
        self.table = table
        self.busy_timeout = busy_timeout
        self._q = f'"{table}"'

    @contextmanager
    def _session(self, write: bool) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout)
        except sqlite3.Error as exc:
            raise ConfigurationError(f"cannot open SQLite schedules at {self.path!r}: {exc}") from exc
        with closing(conn):
            if not write:
                yield conn
                return
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise TransientError(f"SQLite schedules busy: {exc}") from exc
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def setup_infrastructure(self) -> None:
        """Create the table and its due index if missing."""
        with self._session(write=True) as conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self._q} ("
                " schedule_id TEXT PRIMARY KEY, definition TEXT NOT NULL, destination TEXT NOT NULL,"
                " body BLOB NOT NULL, headers TEXT NOT NULL, state TEXT NOT NULL, cursor_us INTEGER,"
                " next_at_us INTEGER, version INTEGER NOT NULL, fired INTEGER NOT NULL, missed INTEGER NOT NULL,"
                " skipped_paused INTEGER NOT NULL, paused_at_us INTEGER, last_fired_us INTEGER)"
            )
            conn.execute(f'CREATE INDEX IF NOT EXISTS "ix_{self.table}_due" ON {self._q}(state, next_at_us)')

    @staticmethod
    def _row(s: Schedule) -> tuple[object, ...]:
        return columns(s, _us)

    @staticmethod
    def _schedule(row: Sequence[Any]) -> Schedule:
        (sid, definition, destination, body, headers, state, cursor, next_at, version, fired, missed, skipped,
         paused_at, last_fired) = row  # fmt: skip
        return Schedule(
            schedule_id=str(sid),
            definition=definition_from_document(json.loads(str(definition))),
            template=MessageTemplate(str(destination), bytes(body), Headers(json.loads(str(headers)))),
            state=ScheduleState(state),
            cursor=_time(cursor),
            next_at=_time(next_at),
            version=int(version),
            fired=int(fired),
            missed=int(missed),
            skipped_paused=int(skipped),
            paused_at=_time(paused_at),
            last_fired=_time(last_fired),
        )

    def create(self, schedule: Schedule) -> None:
        """Insert; ``ScheduleExistsError`` when the id is taken."""
        with self._session(write=True) as conn:
            try:
                conn.execute(f"INSERT INTO {self._q} ({_FIELDS}) VALUES ({', '.join('?' * 14)})", self._row(schedule))
            except sqlite3.IntegrityError:
                raise ScheduleExistsError(f"schedule {schedule.schedule_id!r} exists already") from None

    def get(self, schedule_id: str) -> Schedule | None:
        """The schedule, or None."""
        with self._session(write=False) as conn:
            row = conn.execute(f"SELECT {_FIELDS} FROM {self._q} WHERE schedule_id = ?", (schedule_id,)).fetchone()
        return None if row is None else self._schedule(row)

    def replace(self, schedule: Schedule, expected_version: int) -> bool:
        """``UPDATE … WHERE version = expected_version``."""
        if schedule.version != expected_version + 1:
            raise ValueError(f"a write after version {expected_version} stores version {expected_version + 1}")
        columns = _FIELDS.split(", ")[1:]
        assignments = ", ".join(f"{c.strip()} = ?" for c in columns)
        values = self._row(schedule)
        with self._session(write=True) as conn:
            cur = conn.execute(
                f"UPDATE {self._q} SET {assignments} WHERE schedule_id = ? AND version = ?",
                (*values[1:], schedule.schedule_id, expected_version),
            )
            return cur.rowcount == 1

    def due(self, horizon: datetime, limit: int) -> Sequence[Schedule]:
        """Active schedules with ``next_at`` at or before ``horizon``, earliest first (the index serves it)."""
        with self._session(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_FIELDS} FROM {self._q} WHERE state = ? AND next_at_us <= ?"
                " ORDER BY next_at_us, schedule_id LIMIT ?",
                (str(ScheduleState.ACTIVE), _us(horizon), max(0, limit)),
            ).fetchall()
        return [self._schedule(r) for r in rows]

    def delete(self, schedule_id: str) -> bool:
        """Forget a schedule."""
        with self._session(write=True) as conn:
            return conn.execute(f"DELETE FROM {self._q} WHERE schedule_id = ?", (schedule_id,)).rowcount > 0

    def list(self, after: str | None = None, limit: int = 100) -> Sequence[Schedule]:
        """Schedules in id order after ``after``."""
        with self._session(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_FIELDS} FROM {self._q} WHERE schedule_id > ? ORDER BY schedule_id LIMIT ?",
                (after or "", max(0, limit)),
            ).fetchall()
        return [self._schedule(r) for r in rows]
