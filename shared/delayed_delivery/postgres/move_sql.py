"""The exactly-once mover's SQL (rows moved from the store's table into the queue table), built once per mover."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from .queue import PostgresQueueTransport
from .store import PostgresDelayedMessageStore

__all__ = ["PacedStatements", "move_statement", "paced_statements"]


@dataclass(frozen=True, slots=True)
class PacedStatements:
    """The exactly-once move in steps, for release control (one transaction: the mover's ``_move_paced_once``)."""

    claim: sql.Composed
    defer: sql.Composed
    move: sql.Composed


def paced_statements(store: PostgresDelayedMessageStore, transport: PostgresQueueTransport) -> PacedStatements:
    """Lock the due rows (naming a deferred row's slot), defer rows to their slots, move the rest."""
    d = sql.Identifier(store.schema, store.table)
    return PacedStatements(
        claim=sql.SQL(
            "SELECT message_id, destination, due_at,"
            " CASE WHEN claim_token IS NULL AND available_at > due_at THEN available_at END, now() FROM {d}"
            " WHERE due_at <= now() AND available_at <= now()"
            ' ORDER BY due_at, message_id COLLATE "C" LIMIT %(limit)s FOR UPDATE SKIP LOCKED'
        ).format(d=d),
        defer=sql.SQL(
            "UPDATE {d} AS d SET available_at = c.slot, claim_token = NULL"
            " FROM unnest(%(ids)s::text[], %(slots)s::timestamptz[]) AS c(id, slot) WHERE d.message_id = c.id"
        ).format(d=d),
        move=sql.SQL(
            "WITH moved AS (DELETE FROM {d} WHERE message_id = ANY(%(ids)s)"
            " RETURNING message_id, destination, body, headers, due_at),"
            " queued AS (INSERT INTO {q} (message_id, destination, body, headers, due_at)"
            " SELECT message_id, destination, body, headers, due_at FROM moved ORDER BY due_at RETURNING due_at)"
            " SELECT message_id, destination, extract(epoch FROM now() - due_at)::float8 FROM moved"
        ).format(d=d, q=transport.identifier),
    )


def move_statement(store: PostgresDelayedMessageStore, transport: PostgresQueueTransport) -> sql.Composed:
    """The exactly-once move: delete due rows and insert them into the queue table in one statement."""
    return sql.SQL(
        "WITH due AS ("
        " SELECT message_id FROM {d} WHERE due_at <= now() AND available_at <= now()"
        ' ORDER BY due_at, message_id COLLATE "C" LIMIT %(limit)s FOR UPDATE SKIP LOCKED),'
        " moved AS (DELETE FROM {d} AS d USING due WHERE d.message_id = due.message_id"
        " RETURNING d.message_id, d.destination, d.body, d.headers, d.due_at)"
        " INSERT INTO {q} (message_id, destination, body, headers, due_at)"
        " SELECT message_id, destination, body, headers, due_at FROM moved ORDER BY due_at"
        " RETURNING extract(epoch FROM now() - due_at)::float8"
    ).format(d=sql.Identifier(store.schema, store.table), q=transport.identifier)
