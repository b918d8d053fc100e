"""The PostgreSQL store's SQL statements, built once per table."""

from __future__ import annotations

from psycopg import sql

__all__ = ["COLUMNS", "FIRST", "LAST", "Statements"]

#: The first and last times a Python datetime holds; a due time outside them is garbage written by hand.
FIRST = "'0001-01-01 00:00:00+00'::timestamptz"
LAST = "'9999-12-31 23:59:59.999999+00'::timestamptz"
#: A row's columns as ``_message`` reads them: headers as text (parsed here), an unholdable due time as NULL.
COLUMNS = (
    "d.message_id, d.destination, d.body, d.headers::text,"
    f" CASE WHEN d.due_at BETWEEN {FIRST} AND {LAST} THEN d.due_at END, d.failure_count"
)
#: A row no dispatcher's claim holds right now (by ``%(now)s``, this host's clock): operators may change it.
_IDLE = f"NOT (claim_token IS NOT NULL AND available_at > due_at AND available_at > %(now)s AND available_at <= {LAST})"


#: The claim token a fetch writes: ``<token>@<slot, epoch µs>`` for a row deferred to its release slot (unclaimed and
#: fetchable later than due: ``defer``), so the fetch names the slot; ``<token>`` otherwise.
_CLAIM = (
    f"CASE WHEN d.claim_token IS NULL AND d.available_at > d.due_at AND d.available_at <= {LAST}"
    " THEN %(token)s || '@' || (extract(epoch FROM d.available_at) * 1000000)::bigint::text ELSE %(token)s END"
)


def _holdable(column: str) -> str:
    """SQL for a time column's value clamped to what a Python datetime holds (beyond year 9999: the first)."""
    within = f"{column} BETWEEN {FIRST} AND {LAST}"
    return f"CASE WHEN {column} IS NULL THEN NULL WHEN {within} THEN {column} ELSE {FIRST} END"


class Statements:
    """Every statement of ``PostgresDelayedMessageStore`` for the table ``t``."""

    def __init__(self, t: sql.Identifier) -> None:
        self._writes(t)
        self._settling(t)
        self._claims(t)
        self._reads(t)

    def _writes(self, t: sql.Identifier) -> None:
        insert = sql.SQL(
            "INSERT INTO {t} AS d (message_id, destination, body, headers, due_at, available_at, failure_count)"
            " VALUES (%(id)s, %(dest)s, %(body)s, %(headers)s::json, {due}, {due}, %(failures)s)"
            " ON CONFLICT (message_id) DO NOTHING RETURNING d.due_at"
        )
        notify_if_earliest = sql.SQL(
            "WITH prev AS (SELECT min(available_at) AS m FROM {t}), up AS ({upsert})"
            " SELECT up.due_at, CASE WHEN prev.m IS NULL OR up.due_at < prev.m THEN pg_notify(%(channel)s,"
            " (extract(epoch FROM up.due_at) * 1000000)::bigint::text) END FROM up, prev"
        )
        self.store = notify_if_earliest.format(t=t, upsert=insert.format(t=t, due=sql.SQL("%(due)s")))
        self.store_after = notify_if_earliest.format(
            t=t, upsert=insert.format(t=t, due=sql.SQL("now() + %(delay)s::interval"))
        )
        self.pending = sql.SQL(f"SELECT {COLUMNS} FROM {{t}} AS d WHERE message_id = %s").format(t=t)
        self.rename = sql.SQL("UPDATE {t} SET message_id = %s WHERE message_id = %s").format(t=t)

    def _settling(self, t: sql.Identifier) -> None:
        self.remove = sql.SQL(f"DELETE FROM {{t}} WHERE message_id = %(id)s AND {_IDLE}").format(t=t)
        self.remove_claimed = sql.SQL("DELETE FROM {t} WHERE message_id = %(id)s AND claim_token = %(claim)s").format(
            t=t
        )
        self.remove_many = sql.SQL(
            f"DELETE FROM {{t}} WHERE message_id = ANY(%(ids)s) AND {_IDLE} RETURNING message_id"
        ).format(t=t)
        self.remove_many_claimed = sql.SQL(
            "DELETE FROM {t} AS d USING unnest(%(ids)s::text[], %(claims)s::text[]) AS c(id, claim)"
            " WHERE d.message_id = c.id AND d.claim_token = c.claim RETURNING d.message_id"
        ).format(t=t)
        self.exists = sql.SQL("SELECT message_id FROM {t} WHERE message_id = ANY(%s) LIMIT 1").format(t=t)
        fail = (
            "UPDATE {t} SET failure_count = least(failure_count, 2147483646) + 1, available_at = due_at"
            " WHERE message_id = %(id)s"
        )
        self.fail = sql.SQL(fail).format(t=t)
        self.fail_claimed = sql.SQL(fail + " AND claim_token = %(claim)s").format(t=t)
        move = "UPDATE {t} SET due_at = %(due)s, available_at = %(due)s, claim_token = NULL WHERE message_id = %(id)s"
        self.reschedule = sql.SQL(f"{move} AND {_IDLE}").format(t=t)
        self.reschedule_claimed = sql.SQL(move + " AND claim_token = %(claim)s").format(t=t)
        self.defer = sql.SQL(
            "UPDATE {t} AS d SET available_at = c.slot, claim_token = NULL"
            " FROM unnest(%(ids)s::text[], %(slots)s::timestamptz[], %(claims)s::text[]) AS c(id, slot, claim)"
            " WHERE d.message_id = c.id AND d.claim_token = c.claim RETURNING d.message_id"
        ).format(t=t)

    def _claims(self, t: sql.Identifier) -> None:
        # The second arm claims rows whose due or claim time no datetime holds (infinity, past year 9999): due now.
        # Two index seeks at the indexes' ends, and only run when the first arm leaves room under the limit.
        claim = (
            f"UPDATE {{t}} AS d SET available_at = {{until}}, claim_token = {_CLAIM} FROM ("
            " SELECT message_id FROM (SELECT message_id FROM {t} WHERE due_at <= {at} AND available_at <= {at}"
            ' ORDER BY due_at, message_id COLLATE "C" LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS ready'
            " UNION ALL SELECT message_id FROM (SELECT message_id FROM {t}"
            f" WHERE (due_at > {LAST} AND available_at <= {{at}}) OR available_at > {LAST}"
            " LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS garbage"
            " LIMIT %(limit)s) AS due"
            " WHERE d.message_id = due.message_id"
            f" RETURNING {COLUMNS}, {{now}}, d.claim_token"
        )
        self.fetch = sql.SQL(claim).format(t=t, until=sql.SQL("%(until)s"), at=sql.SQL("%(at)s"), now=sql.SQL("%(at)s"))
        self.fetch_capped = sql.SQL(claim).format(
            t=t,
            until=sql.SQL("least(%(at)s, now()) + %(claim)s::interval"),
            at=sql.SQL("least(%(at)s, now())"),
            now=sql.SQL("now()"),
        )
        self.claim_now = sql.SQL(claim).format(
            t=t,
            until=sql.SQL("now() + %(claim)s::interval"),
            at=sql.SQL("now() + %(ahead)s::interval"),
            now=sql.SQL("now()"),
        )

    def _reads(self, t: sql.Identifier) -> None:
        next_due = _holdable("min(available_at)")
        self.next_due = sql.SQL(f"SELECT {next_due} FROM {{t}}").format(t=t)
        self.until_next_due = sql.SQL(
            f"SELECT extract(epoch FROM {next_due} - clock_timestamp())::float8 FROM {{t}}"
        ).format(t=t)
        self.get = sql.SQL(f"SELECT {COLUMNS} FROM {{t}} AS d WHERE message_id = %s").format(t=t)
        self.count = sql.SQL("SELECT count(*) FROM {t}").format(t=t)
        self.release_backlog = sql.SQL(
            "SELECT destination, count(*), max(available_at) FROM {t} WHERE claim_token IS NULL"
            f" AND available_at > due_at AND available_at <= {LAST} GROUP BY destination"
        ).format(t=t)
        self.earliest = sql.SQL(f"SELECT {_holdable('min(due_at)')} FROM {{t}}").format(t=t)
        self.backlog = sql.SQL(
            f"SELECT {_holdable('to_timestamp(floor(extract(epoch FROM due_at) / %(size)s) * %(size)s)')} AS bucket,"
            " count(*) FROM {t} GROUP BY bucket ORDER BY bucket"
        ).format(t=t)
