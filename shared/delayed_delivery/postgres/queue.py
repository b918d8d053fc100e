"""An outbox-style queue table: the transport for moving due messages within one database.

Settings: ``conninfo``; ``table`` (default ``queue``); ``schema`` (default ``public``).

One table holds every destination (column ``destination``); consumers ``receive`` with
``FOR UPDATE SKIP LOCKED``. When the delayed-message table lives in the same database, the
batch mover inserts here and deletes there in one transaction, so each due message is
delivered exactly once. Used as a plain ``Transport`` (``send``) it is at-least-once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from ..clock import utc
from ..errors import InvalidMessageError
from ..model import DelayedMessage, Headers
from .connection import ConnectionSet, derived_name, validate_identifier

__all__ = ["PostgresQueueTransport", "QueuedMessage"]


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A message taken from the queue table, with when it was enqueued (database clock)."""

    message: DelayedMessage
    enqueued_at: datetime
    sequence: int


class PostgresQueueTransport:
    """Sends due messages into the PostgreSQL table ``queue`` (one row per message)."""

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = "queue",
        schema: str = "public",
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
    ) -> None:
        self.table = validate_identifier("table", table)
        self.schema = validate_identifier("schema", schema)
        self.conninfo = conninfo
        self._timeouts = (connect_timeout, statement_timeout)
        self.identifier = sql.Identifier(self.schema, self.table)
        self.qualified_name = f'"{self.schema}"."{self.table}"'
        self._db = ConnectionSet(
            conninfo,
            what=f"queue table {self.qualified_name}",
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
        )
        t = self.identifier
        self._sql_send = sql.SQL(
            "INSERT INTO {t} (message_id, destination, body, headers, due_at) VALUES (%s, %s, %s, %s::json, %s)"
        ).format(t=t)
        self._sql_receive = sql.SQL(
            "DELETE FROM {t} AS q USING ("
            " SELECT seq FROM {t} WHERE destination = %s ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED) AS head"
            " WHERE q.seq = head.seq"
            " RETURNING q.message_id, q.destination, q.body, q.headers, q.due_at, q.enqueued_at, q.seq"
        ).format(t=t)

    def __getstate__(self) -> dict[str, object]:
        connect_timeout, statement_timeout = self._timeouts
        return {
            "conninfo": self.conninfo,
            "table": self.table,
            "schema": self.schema,
            "connect_timeout": connect_timeout,
            "statement_timeout": statement_timeout,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("conninfo"), **state)  # type: ignore[misc]

    def setup_infrastructure(self) -> None:
        """Create the queue table and its index if missing."""
        t = self.identifier
        with self._db.ddl_cursor(self.schema, self.qualified_name) as cur:
            cur.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {t} ("
                    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                    " message_id text NOT NULL,"
                    " destination text NOT NULL,"
                    " body bytea NOT NULL,"
                    " headers json NOT NULL,"
                    " due_at timestamptz NOT NULL,"
                    " enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp())"
                ).format(t=t)
            )
            cur.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {ix} ON {t} (destination, seq)").format(
                    ix=sql.Identifier(derived_name(self.table, "_destination_ix")), t=t
                )
            )

    def drop_infrastructure(self) -> None:
        """Drop the queue table."""
        with self._db.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {t}").format(t=self.identifier))

    def close(self) -> None:
        """Close every connection this object opened."""
        self._db.close()

    def send(self, message: DelayedMessage) -> None:
        """Append ``message`` to its destination (own transaction: at-least-once with the store)."""
        if "\x00" in message.message_id or "\x00" in message.destination:
            raise InvalidMessageError("message_id and destination must not contain NUL characters for PostgreSQL")
        with self._db.cursor() as cur:
            cur.execute(
                self._sql_send,
                (
                    message.message_id,
                    message.destination,
                    message.body,
                    json.dumps(dict(message.headers)),
                    message.due_at,
                ),
            )

    def receive(self, destination: str, limit: int = 10) -> list[QueuedMessage]:
        """Take (delete and return) up to ``limit`` messages for ``destination``, oldest first."""
        with self._db.cursor() as cur:
            cur.execute(self._sql_receive, (destination, limit))
            rows = cur.fetchall()
        rows.sort(key=lambda r: r[6])
        return [self._queued(r) for r in rows]

    def count(self, destination: str | None = None) -> int:
        """Messages waiting (for ``destination``, or in total)."""
        query = sql.SQL("SELECT count(*) FROM {t}").format(t=self.identifier)
        params: tuple[str, ...] = ()
        if destination is not None:
            query = sql.SQL("SELECT count(*) FROM {t} WHERE destination = %s").format(t=self.identifier)
            params = (destination,)
        with self._db.cursor() as cur:
            cur.execute(query, params)
            row = cur.fetchone()
        return 0 if row is None else int(row[0])

    def message_ids(self) -> Sequence[str]:
        """Every queued message id, in queue order (tests and operators)."""
        with self._db.cursor() as cur:
            cur.execute(sql.SQL("SELECT message_id FROM {t} ORDER BY seq").format(t=self.identifier))
            return [r[0] for r in cur.fetchall()]

    @staticmethod
    def _queued(row: Sequence[Any]) -> QueuedMessage:
        message_id, destination, body, headers, due_at, enqueued_at, seq = row
        message = DelayedMessage(
            message_id=message_id,
            destination=destination,
            body=bytes(body),
            headers=Headers(headers if isinstance(headers, dict) else json.loads(headers)),
            due_at=utc(due_at),
        )
        return QueuedMessage(message=message, enqueued_at=utc(enqueued_at), sequence=int(seq))
