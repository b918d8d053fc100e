"""The PostgreSQL delayed-message store (extra ``postgres``, driver psycopg 3).

Settings: ``conninfo`` (libpq string or ``postgresql://`` URL); ``endpoint`` (table
``<endpoint>_delayed``) or ``table`` (default ``delayed_messages``); ``schema`` (default
``public``); ``claim_timeout`` (seconds, default 60); ``notify_channel`` (default
``<table>_due``); ``connect_timeout`` and ``statement_timeout`` (seconds);
``never_before_database_time`` (default False; when True, ``fetch_due(at)`` uses
``least(at, now())`` so a dispatcher whose clock runs fast cannot claim early); ``prepare``
(default True; False for poolers that cannot keep prepared statements). Names are validated
and always quoted.

Guarantees:

- ``fetch_due`` claims with ``FOR UPDATE SKIP LOCKED`` ordered by due time, so any number of
  dispatchers share one table with no leader and no message claimed twice while its claim lasts.
- A claim that is not settled (dispatcher crashed) expires after ``claim_timeout`` and the
  message is fetched again: nothing is lost (at-least-once).
- ``store_after`` fixes the due time on the **database clock** (``now() + delay``), so a sender
  whose clock is wrong cannot make a message due early; ``claim_due`` compares with the
  database clock too.
- Storing a message due before every other one sends ``NOTIFY <channel>`` (payload: due time
  in epoch microseconds) in the same statement, so listening dispatchers wake at once.
- A due row that cannot be read (written by hand: headers that are not a JSON object of strings, a blank or
  over-long id or destination, a due time no Python datetime holds) is handed out as a well-formed stand-in
  marked ``DelayedDelivery.Unreadable`` (``model.unreadable_message``), which the dispatcher moves to the
  error queue; it never blocks the rows claimed with it. A due or claim time of ``infinity`` or past year
  9999 counts as due now.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from ..clock import utc
from ..durations import Delay, to_seconds
from ..errors import ConfigurationError, InvalidMessageError
from ..model import DelayedMessage, Headers, is_usable_message_id, unreadable_message
from ..ports import ClaimedMessage, DelayedMessageStore, id_conflict, in_flight, same_message
from ..validation import is_number
from .connection import ConnectionSet, derived_name, validate_identifier
from .store_sql import Statements

__all__ = ["DEFAULT_TABLE", "PostgresDelayedMessageStore"]

#: Table used when neither ``endpoint`` nor ``table`` is given (same default as the SQLite store).
DEFAULT_TABLE = "delayed_messages"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _slot_of(token: str) -> datetime | None:
    """The release slot a claim token ``<token>@<epoch µs>`` names (a deferred row), else None."""
    _, _, micros = token.partition("@")
    if not micros.isdigit():
        return None
    try:
        return _EPOCH + timedelta(microseconds=int(micros))
    except OverflowError:
        return None


def _check_text(message: DelayedMessage) -> None:
    """PostgreSQL ``text`` cannot hold NUL; say so before the database does."""
    if "\x00" in message.message_id or "\x00" in message.destination:
        raise InvalidMessageError("message_id and destination must not contain NUL characters for PostgreSQL")


class PostgresDelayedMessageStore(DelayedMessageStore):
    """Delayed messages in the PostgreSQL table ``<endpoint>_delayed`` (or ``table``)."""

    def __init__(
        self,
        conninfo: str,
        *,
        endpoint: str | None = None,
        table: str | None = None,
        schema: str = "public",
        claim_timeout: float = 60.0,
        notify_channel: str | None = None,
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
        never_before_database_time: bool = False,
        prepare: bool = True,
    ) -> None:
        if table is None:
            if endpoint is None:
                table = DEFAULT_TABLE
            else:
                validate_identifier("endpoint", endpoint)
                table = derived_name(endpoint, "_delayed")
        self.endpoint = endpoint
        self.table = validate_identifier("table", table)
        self.schema = validate_identifier("schema", schema)
        if not (is_number(claim_timeout) and claim_timeout > 0):
            raise ConfigurationError(f"claim_timeout must be a positive number of seconds, got {claim_timeout!r}")
        self.claim_timeout = float(claim_timeout)
        self.notify_channel = validate_identifier(
            "notify channel", notify_channel if notify_channel is not None else derived_name(table, "_due")
        )
        self.never_before_database_time = bool(never_before_database_time)
        self.conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self.qualified_name = f'"{self.schema}"."{self.table}"'
        self._db = ConnectionSet(
            conninfo,
            what=f"delayed-message table {self.qualified_name}",
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
            prepare=prepare,
        )
        self._t = sql.Identifier(self.schema, self.table)
        self._claim = timedelta(seconds=self.claim_timeout)
        self._q = Statements(self._t)

    # -- pickling (a factory for other processes) ---------------------------

    def __getstate__(self) -> dict[str, object]:
        return {
            "conninfo": self.conninfo,
            "table": self.table,
            "schema": self.schema,
            "claim_timeout": self.claim_timeout,
            "notify_channel": self.notify_channel,
            "connect_timeout": self._connect_timeout,
            "statement_timeout": self._statement_timeout,
            "endpoint": self.endpoint,
            "never_before_database_time": self.never_before_database_time,
            "prepare": self._db.prepare,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        conninfo = state.pop("conninfo")
        endpoint = state.pop("endpoint")
        self.__init__(conninfo, **state)  # type: ignore[misc]
        self.endpoint = endpoint

    def __repr__(self) -> str:
        return f"PostgresDelayedMessageStore(table={self.qualified_name}, claim_timeout={self.claim_timeout})"

    # -- infrastructure ------------------------------------------------------

    def setup_infrastructure(self) -> None:
        """Create the schema, the table and its indexes if missing (safe to run concurrently)."""
        t = self._t
        with self._db.ddl_cursor(self.schema, self.qualified_name) as cur:
            cur.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {t} ("
                    " message_id text PRIMARY KEY,"
                    " destination text NOT NULL,"
                    " body bytea NOT NULL,"
                    " headers json NOT NULL,"
                    " due_at timestamptz NOT NULL,"
                    " available_at timestamptz NOT NULL,"
                    " failure_count integer NOT NULL DEFAULT 0 CHECK (failure_count >= 0),"
                    " stored_at timestamptz NOT NULL DEFAULT now(),"
                    " claim_token text)"
                ).format(t=t)
            )
            # tables made before claim tokens: the column, NULL (no token) in every existing row
            cur.execute(sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS claim_token text").format(t=t))
            for suffix, column in (("_due_ix", "due_at"), ("_available_ix", "available_at")):
                cur.execute(
                    sql.SQL("CREATE INDEX IF NOT EXISTS {ix} ON {t} ({col})").format(
                        ix=sql.Identifier(derived_name(self.table, suffix)), t=t, col=sql.Identifier(column)
                    )
                )

    def drop_infrastructure(self) -> None:
        """Drop the table and everything in it (tests and teardown)."""
        with self._db.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {t}").format(t=self._t))
            release = sql.Identifier(self.schema, derived_name(self.table, "_release"))  # the movers' release schedule
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {t}").format(t=release))

    def close(self) -> None:
        """Close every connection this object opened."""
        self._db.close()

    def cursor(self, *, transaction: bool = False) -> AbstractContextManager[psycopg.Cursor[Any]]:
        """A cursor on this thread's connection with errors translated (for same-database moves)."""
        return self._db.cursor(transaction=transaction)

    # -- the store protocol --------------------------------------------------

    def store(self, message: DelayedMessage) -> None:
        """Insert ``message`` (due at its own ``due_at``); NOTIFY when it is now the earliest.

        The same message again is a no-op; another under a pending id raises ``MessageIdConflictError``.
        """
        _check_text(message)
        with self._db.cursor() as cur:
            cur.execute(self._q.store, self._params(message, due=message.due_at))
            if cur.fetchone() is None:
                self._check_pending(cur, message)

    def store_after(
        self,
        delay: Delay,
        destination: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> DelayedMessage:
        """Store a message due ``delay`` after the database's ``now()``; returns it with that due time."""
        seconds = to_seconds(delay)
        if seconds < 0:
            raise InvalidMessageError(f"delay must not be negative, got {seconds} s")
        draft = DelayedMessage(
            message_id=message_id if message_id is not None else str(uuid.uuid4()),
            destination=destination,
            body=body,
            due_at=_EPOCH,
            headers=headers or {},
        )
        _check_text(draft)
        with self._db.cursor() as cur:
            cur.execute(self._q.store_after, self._params(draft, delay=timedelta(seconds=seconds)))
            row = cur.fetchone()
        if row is None:  # the id is pending: its due time was fixed by an earlier call, so this is another message
            raise id_conflict(draft.message_id)
        return DelayedMessage(draft.message_id, draft.destination, draft.body, utc(row[0]), draft.headers)

    def store_many(self, messages: Sequence[DelayedMessage]) -> None:
        """Insert many messages in one transaction (all or none; NOTIFY for each new earliest, sent at commit)."""
        for m in messages:
            _check_text(m)
        if not messages:
            return
        with self._db.cursor(transaction=True) as cur:
            cur.executemany(self._q.store, [self._params(m, due=m.due_at) for m in messages], returning=True)
            kept: list[DelayedMessage] = []
            for m in messages:
                if cur.fetchone() is None:
                    kept.append(m)
                cur.nextset()
            for m in kept:
                self._check_pending(cur, m)

    def _check_pending(self, cur: psycopg.Cursor[Any], message: DelayedMessage) -> None:
        """After an insert that found the id taken: a no-op when the pending message is this one, else refuse."""
        for _ in range(3):
            cur.execute(self._q.pending, (message.message_id,))
            row = cur.fetchone()
            if row is not None:
                try:
                    pending = self._message(row)
                except (ValueError, TypeError, OverflowError, RecursionError):
                    raise id_conflict(message.message_id) from None
                if not same_message(pending, message):
                    raise id_conflict(message.message_id)
                return
            cur.execute(self._q.store, self._params(message, due=message.due_at))  # removed meanwhile
            if cur.fetchone() is not None:
                return
        raise id_conflict(message.message_id)

    def remove(self, message_id: str, claim: str | None = None) -> bool:
        """Delete; False when gone or (with ``claim``) superseded; an operator's cancel of a claimed row raises."""
        with self._db.cursor() as cur:
            if claim is not None:
                cur.execute(self._q.remove_claimed, {"id": message_id, "claim": claim})
                return cur.rowcount > 0
            cur.execute(self._q.remove, {"id": message_id, "now": datetime.now(UTC)})
            if cur.rowcount > 0:
                return True
            self._refuse_in_flight(cur, [message_id])
            return False

    def remove_many(self, message_ids: Sequence[str], claims: Sequence[str | None] | None = None) -> Sequence[bool]:
        """Delete many in one statement; one flag per id (a repeated id counts once); ``claims``: see ``remove``."""
        if not message_ids:
            return []
        with self._db.cursor() as cur:
            if claims is None or any(c is None for c in claims):
                cur.execute(self._q.remove_many, {"ids": list(message_ids), "now": datetime.now(UTC)})
            else:
                cur.execute(self._q.remove_many_claimed, {"ids": list(message_ids), "claims": list(claims)})
            gone = {row[0] for row in cur.fetchall()}
            if claims is None or any(c is None for c in claims):
                self._refuse_in_flight(cur, [mid for mid in message_ids if mid not in gone])
        flags: list[bool] = []
        for mid in message_ids:
            flags.append(mid in gone)
            gone.discard(mid)
        return flags

    def _refuse_in_flight(self, cur: psycopg.Cursor[Any], not_removed: Sequence[str]) -> None:
        """Raise ``MessageInFlightError`` when an id an operator's removal did not remove is still there."""
        if not_removed:
            cur.execute(self._q.exists, (list(not_removed),))
            row = cur.fetchone()
            if row is not None:
                raise in_flight(row[0])

    def increment_failure_count(self, message_id: str, claim: str | None = None) -> bool:
        """Count a failure and release the claim (its token stays); False when gone or superseded."""
        with self._db.cursor() as cur:
            if claim is None:
                cur.execute(self._q.fail, {"id": message_id})
            else:
                cur.execute(self._q.fail_claimed, {"id": message_id, "claim": claim})
            return cur.rowcount > 0

    def reschedule(self, message_id: str, due_at: datetime, claim: str | None = None) -> bool:
        """Move the due time and release the claim; False when gone or superseded; refused while in flight."""
        params = {"due": utc(due_at), "id": message_id, "claim": claim, "now": datetime.now(UTC)}
        with self._db.cursor() as cur:
            cur.execute(self._q.reschedule if claim is None else self._q.reschedule_claimed, params)
            if cur.rowcount > 0:
                return True
            if claim is None:
                self._refuse_in_flight(cur, [message_id])
            return False

    def next_due(self) -> datetime | None:
        """Earliest time a message becomes fetchable (claimed ones: when their claim expires)."""
        with self._db.cursor() as cur:
            cur.execute(self._q.next_due)
            row = cur.fetchone()
        return None if row is None or row[0] is None else utc(row[0])

    def seconds_until_next_due(self) -> float | None:
        """Seconds from the database clock's now until ``next_due`` (negative when overdue), or None."""
        with self._db.cursor() as cur:
            cur.execute(self._q.until_next_due)
            row = cur.fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """Claim up to ``limit`` messages due at ``at`` (never later than the database's now when capped)."""
        if limit < 1:
            return []
        at = utc(at)
        if self.never_before_database_time:
            params = {"at": at, "claim": self._claim, "limit": limit}
            return self._claim_rows(self._q.fetch_capped, params)[1]
        params = {"at": at, "until": at + self._claim, "limit": limit}
        return self._claim_rows(self._q.fetch, params)[1]

    def claim_due(self, limit: int, *, look_ahead: float = 0.0) -> tuple[datetime, list[DelayedMessage]]:
        """Claim up to ``limit`` messages due by the database's ``now() + look_ahead``; returns (db now, batch)."""
        if look_ahead < 0:
            raise ConfigurationError("look_ahead must not be negative")
        if limit < 1:
            return self.database_now(), []
        params = {"claim": self._claim, "ahead": timedelta(seconds=look_ahead), "limit": limit}
        now, batch = self._claim_rows(self._q.claim_now, params)
        return (now if now is not None else self.database_now()), batch

    def _claim_rows(self, query: sql.Composed, params: dict[str, Any]) -> tuple[datetime | None, list[DelayedMessage]]:
        token = uuid.uuid4().hex
        with self._db.cursor() as cur:
            cur.execute(query, {**params, "token": token})
            rows = cur.fetchall()
            now = utc(rows[0][6]) if rows else None
            batch: list[DelayedMessage] = [
                ClaimedMessage.of(self._read(r[:6], now or _EPOCH, cur), str(r[7]), _slot_of(str(r[7]))) for r in rows
            ]
        batch.sort(key=lambda m: (m.due_at, m.message_id))
        return now, batch

    def defer(self, deferrals: Sequence[tuple[str, datetime, str]]) -> Sequence[bool]:
        """Release each claim, the row fetchable again at its release slot (due time unchanged); one statement."""
        if not deferrals:
            return []
        ids, slots, claims = zip(*deferrals, strict=True)
        with self._db.cursor() as cur:
            cur.execute(
                self._q.defer,
                {"ids": list(ids), "slots": [utc(s) for s in slots], "claims": list(claims)},
            )
            kept = {row[0] for row in cur.fetchall()}
        return [mid in kept for mid in ids]

    def release_backlog(self) -> Mapping[str, tuple[int, datetime]]:
        """Deferred rows per destination: how many, and the latest slot among them."""
        with self._db.cursor() as cur:
            cur.execute(self._q.release_backlog)
            rows = cur.fetchall()
        return {str(d): (int(n), utc(latest)) for d, n, latest in rows}

    def database_now(self) -> datetime:
        """The database clock (``clock_timestamp()``)."""
        with self._db.cursor() as cur:
            cur.execute("SELECT clock_timestamp()")
            row = cur.fetchone()
        assert row is not None
        return utc(row[0])

    # -- operator helpers ------------------------------------------------------

    def get(self, message_id: str) -> DelayedMessage | None:
        """The stored message with this id, claimed or not."""
        with self._db.cursor() as cur:
            cur.execute(self._q.get, (message_id,))
            row = cur.fetchone()
        return None if row is None else self._read(row, _EPOCH, None)

    def earliest_due(self) -> datetime | None:
        """The earliest due time of any pending message, claimed or not."""
        with self._db.cursor() as cur:
            cur.execute(self._q.earliest)
            row = cur.fetchone()
        return None if row is None or row[0] is None else utc(row[0])

    def backlog(self, bucket_seconds: int) -> Sequence[tuple[datetime, int]]:
        """Pending counts per due-time bucket (bucket start, count), earliest first."""
        with self._db.cursor() as cur:
            cur.execute(self._q.backlog, {"size": max(1, int(bucket_seconds))})
            rows = cur.fetchall()
        return [(utc(bucket), int(n)) for bucket, n in rows]

    def __len__(self) -> int:
        with self._db.cursor() as cur:
            cur.execute(self._q.count)
            row = cur.fetchone()
        return 0 if row is None else int(row[0])

    # -- internals ----------------------------------------------------------------

    def _params(self, message: DelayedMessage, **extra: object) -> dict[str, object]:
        return {
            "id": message.message_id,
            "dest": message.destination,
            "body": message.body,
            "headers": json.dumps(dict(message.headers)),
            "failures": message.failure_count,
            "channel": self.notify_channel,
            **extra,
        }

    def _read(self, row: Sequence[Any], now: datetime, cur: psycopg.Cursor[Any] | None) -> DelayedMessage:
        """The message in a row of ``_COLUMNS``, or its unreadable stand-in (with ``cur``: given a usable id)."""
        message_id, destination, body, _, due_at, _ = row
        try:
            return self._message(row)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            reason = f"row {str(message_id)[:140]!r} of {self.qualified_name}: {type(exc).__name__}: {exc}"
            if cur is not None and not is_usable_message_id(message_id):
                renamed = f"unreadable-{uuid.uuid4().hex}"  # the stand-in's id must find the row
                cur.execute(self._q.rename, (renamed, message_id))
                message_id = renamed
            return unreadable_message(message_id, destination, body, now if due_at is None else utc(due_at), reason)

    @staticmethod
    def _message(row: Sequence[Any]) -> DelayedMessage:
        """The message in a row of ``_COLUMNS``; ``ValueError``/``TypeError`` when it is garbage."""
        message_id, destination, body, headers, due_at, failures = row
        if due_at is None:
            raise ValueError("the due time is not one a datetime holds (infinity, or before year 1 or after 9999)")
        values = json.loads(headers)
        if not isinstance(values, dict):
            raise TypeError(f"headers are a JSON {type(values).__name__}, not an object")
        return DelayedMessage(
            message_id=message_id,
            destination=destination,
            body=bytes(body),
            headers=Headers(values),
            due_at=utc(due_at),
            failure_count=int(failures),
        )
