"""Recurring schedules in PostgreSQL (table ``delayed_schedules`` by default), beside the delayed messages.

The same rows as the SQLite store (``schedules/sqlite_store.py``): what a query needs in columns (state,
``next_at`` indexed with it, cursor, version, counters), the definition as its JSON document
(``ScheduleDefinition.document``, read back by ``definition_from_document`` whatever version wrote it). The
conditional write is ``UPDATE … WHERE schedule_id = %s AND version = %s``; instants are ``timestamptz``
(microseconds). Run the materializer inside the dispatcher's loop as on SQLite
(``schedules.loop.run_with_schedules`` with a ``Dispatcher`` over ``PostgresDelayedMessageStore``): any number of
loops may share the table, each schedule's cursor moving by one conditional write at a time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import sql

from ..clock import utc
from ..model import Headers
from ..schedules.model import MessageTemplate, Schedule, ScheduleState, columns, definition_from_document
from ..schedules.ports import ScheduleExistsError, ScheduleStore
from .connection import ConnectionSet, validate_identifier

__all__ = ["DEFAULT_SCHEDULE_TABLE", "PostgresScheduleStore"]

DEFAULT_SCHEDULE_TABLE = "delayed_schedules"
_COLUMNS = (
    "schedule_id",
    "definition",
    "destination",
    "body",
    "headers",
    "state",
    "cursor_at",
    "next_at",
    "version",
    "fired",
    "missed",
    "skipped_paused",
    "paused_at",
    "last_fired",
)


class PostgresScheduleStore(ScheduleStore):
    """A ``ScheduleStore`` in the PostgreSQL table ``table`` (schema ``schema``)."""

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = DEFAULT_SCHEDULE_TABLE,
        schema: str = "public",
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
        prepare: bool = True,
    ) -> None:
        self.table = validate_identifier("table", table)
        self.schema = validate_identifier("schema", schema)
        self.qualified_name = f'"{self.schema}"."{self.table}"'
        self._db = ConnectionSet(
            conninfo,
            what=f"schedule table {self.qualified_name}",
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
            prepare=prepare,
        )
        self._t = sql.Identifier(self.schema, self.table)
        self._fields = sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMNS)

    def setup_infrastructure(self) -> None:
        """Create the schema, the table and its due index if missing (safe to run concurrently)."""
        with self._db.ddl_cursor(self.schema, self.qualified_name) as cur:
            cur.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {t} ("
                    " schedule_id text PRIMARY KEY, definition text NOT NULL, destination text NOT NULL,"
                    " body bytea NOT NULL, headers text NOT NULL, state text NOT NULL, cursor_at timestamptz,"
                    " next_at timestamptz, version bigint NOT NULL, fired bigint NOT NULL, missed bigint NOT NULL,"
                    " skipped_paused bigint NOT NULL, paused_at timestamptz, last_fired timestamptz)"
                ).format(t=self._t)
            )
            cur.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (state, next_at)").format(
                    i=sql.Identifier(f"{self.table[:50]}_due"), t=self._t
                )
            )

    def drop_infrastructure(self) -> None:
        """Drop the table and everything in it (tests and teardown)."""
        with self._db.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {t}").format(t=self._t))

    def close(self) -> None:
        """Close every connection this object opened."""
        self._db.close()

    @staticmethod
    def _row(s: Schedule) -> tuple[object, ...]:
        return columns(s, lambda instant: instant)

    @staticmethod
    def _schedule(row: Sequence[Any]) -> Schedule:
        (sid, definition, destination, body, headers, state, cursor, next_at, version, fired, missed, skipped,
         paused_at, last_fired) = row  # fmt: skip
        return Schedule(
            schedule_id=str(sid),
            definition=definition_from_document(json.loads(str(definition))),
            template=MessageTemplate(str(destination), bytes(body), Headers(json.loads(str(headers)))),
            state=ScheduleState(state),
            cursor=cursor,
            next_at=next_at,
            version=int(version),
            fired=int(fired),
            missed=int(missed),
            skipped_paused=int(skipped),
            paused_at=paused_at,
            last_fired=last_fired,
        )

    def create(self, schedule: Schedule) -> None:
        """Insert; ``ScheduleExistsError`` when the id is taken."""
        query = sql.SQL("INSERT INTO {t} ({f}) VALUES ({v}) ON CONFLICT (schedule_id) DO NOTHING").format(
            t=self._t, f=self._fields, v=sql.SQL(", ").join(sql.Placeholder() * len(_COLUMNS))
        )
        with self._db.cursor() as cur:
            cur.execute(query, self._row(schedule))
            if cur.rowcount != 1:
                raise ScheduleExistsError(f"schedule {schedule.schedule_id!r} exists already")

    def get(self, schedule_id: str) -> Schedule | None:
        """The schedule, or None."""
        with self._db.cursor() as cur:
            cur.execute(
                sql.SQL("SELECT {f} FROM {t} WHERE schedule_id = %s").format(f=self._fields, t=self._t), (schedule_id,)
            )
            row = cur.fetchone()
        return None if row is None else self._schedule(row)

    def replace(self, schedule: Schedule, expected_version: int) -> bool:
        """``UPDATE … WHERE version = expected_version``."""
        if schedule.version != expected_version + 1:
            raise ValueError(f"a write after version {expected_version} stores version {expected_version + 1}")
        assignments = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in _COLUMNS[1:])
        query = sql.SQL("UPDATE {t} SET {a} WHERE schedule_id = %s AND version = %s").format(t=self._t, a=assignments)
        with self._db.cursor() as cur:
            cur.execute(query, (*self._row(schedule)[1:], schedule.schedule_id, expected_version))
            return cur.rowcount == 1

    def due(self, horizon: datetime, limit: int) -> Sequence[Schedule]:
        """Active schedules with ``next_at`` at or before ``horizon``, earliest first (the index serves it)."""
        query = sql.SQL(
            "SELECT {f} FROM {t} WHERE state = %s AND next_at <= %s ORDER BY next_at, schedule_id LIMIT %s"
        ).format(f=self._fields, t=self._t)
        with self._db.cursor() as cur:
            cur.execute(query, (str(ScheduleState.ACTIVE), utc(horizon), max(0, limit)))
            rows = cur.fetchall()
        return [self._schedule(r) for r in rows]

    def delete(self, schedule_id: str) -> bool:
        """Forget a schedule."""
        with self._db.cursor() as cur:
            cur.execute(sql.SQL("DELETE FROM {t} WHERE schedule_id = %s").format(t=self._t), (schedule_id,))
            return cur.rowcount > 0

    def list(self, after: str | None = None, limit: int = 100) -> Sequence[Schedule]:
        """Schedules in id order after ``after``."""
        query = sql.SQL(
            'SELECT {f} FROM {t} WHERE schedule_id COLLATE "C" > %s ORDER BY schedule_id COLLATE "C" LIMIT %s'
        )
        with self._db.cursor() as cur:
            cur.execute(query.format(f=self._fields, t=self._t), (after or "", max(0, limit)))
            rows = cur.fetchall()
        return [self._schedule(r) for r in rows]
