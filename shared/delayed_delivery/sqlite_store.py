"""The embedded default store: one SQLite file, safe for many threads and processes.

Guarantees: claims are atomic (``BEGIN IMMEDIATE`` serialises writers across processes),
so no two dispatchers fetch the same message while its claim lasts; a claim that is not
settled (dispatcher crashed) expires after ``claim_timeout`` seconds and the message is
fetched again, so nothing is lost (at-least-once). WAL journal, ``synchronous=FULL``.

A due row that cannot be read (written by hand: a body that is not a BLOB, headers that are not a JSON object
of strings, an unusable id or destination, a due or claim time that is not a time, text that is not UTF-8) is
handed out as a well-formed stand-in marked ``DelayedDelivery.Unreadable`` (``model.unreadable_message``),
which the dispatcher moves to the error queue; it never blocks the rows fetched with it. A row whose due or
claim time is not a number in datetime's range counts as due now.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from .clock import utc
from .errors import ConfigurationError, TransientError
from .model import DelayedMessage, Headers, is_usable_message_id, unreadable_message
from .ports import ClaimedMessage, DelayedMessageStore, id_conflict, in_flight, same_message

__all__ = ["SqliteDelayedMessageStore"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMNS = "message_id, destination, body, headers, due_at_us, failure_count"
_INSERT = (
    "(message_id, destination, body, headers, due_at_us, available_at_us, failure_count) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _to_us(value: datetime) -> int:
    delta = utc(value) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


#: Microseconds of the first and last datetimes; SQLite sorts text and blobs after every number.
_FIRST_US = _to_us(datetime.min.replace(tzinfo=UTC))
_LAST_US = _to_us(datetime.max.replace(tzinfo=UTC))
#: The claim token a fetch writes: ``<token>@<slot µs>`` for a row deferred to its release slot (unclaimed, fetchable
#: later than due), so the fetch can name the slot; ``<token>`` otherwise.
_CLAIM = (
    f"CASE WHEN claim_token IS NULL AND available_at_us > due_at_us AND available_at_us <= {_LAST_US}"
    " AND typeof(available_at_us) = 'integer' THEN ? || '@' || available_at_us ELSE ? END"
)


def _time_or(value: object, default: datetime) -> datetime:
    """The time a stored microsecond count stands for, or ``default`` when it is not one (garbage in the row)."""
    if isinstance(value, int) and _FIRST_US <= value <= _LAST_US:
        return _from_us(value)
    return default


def _text(raw: bytes) -> str:
    """TEXT as str; bytes that are not UTF-8 become lone surrogates, which the model refuses (an unreadable row)."""
    return raw.decode("utf-8", "surrogateescape")


class SqliteDelayedMessageStore(DelayedMessageStore):
    """Delayed messages in a SQLite table (default ``delayed_messages``) in the file at ``path``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        table: str = "delayed_messages",
        claim_timeout: float = 60.0,
        busy_timeout: float = 30.0,
    ) -> None:
        if not _IDENTIFIER.match(table):
            raise ConfigurationError(
                f"invalid SQLite table name {table!r}: use letters, digits and underscores, up to 63 characters"
            )
        self.path = os.fspath(path)
        self.table = table
        self.claim_timeout_us = int(claim_timeout * 1_000_000)
        self._busy_ms = int(busy_timeout * 1000)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._q = f'"{table}"'

    def __getstate__(self) -> dict[str, object]:
        return {
            "path": self.path,
            "table": self.table,
            "claim_timeout": self.claim_timeout_us / 1e6,
            "busy_timeout": self._busy_ms / 1000,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        path, table = state.pop("path"), state.pop("table")
        self.__init__(path, table=table, **state)  # type: ignore[misc]

    # -- connection handling --------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self.path, isolation_level=None, timeout=self._busy_ms / 1000, check_same_thread=False
                )
                conn.text_factory = _text
                conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
            except sqlite3.Error as exc:
                raise ConfigurationError(f"cannot open SQLite store at {self.path!r}: {exc}") from exc
            self._local.conn = conn
            self._add_claim_column(conn)
            with self._all_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise TransientError(f"SQLite store busy: {exc}") from exc
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def close(self) -> None:
        """Close every connection this object opened."""
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()

    def _add_claim_column(self, conn: sqlite3.Connection) -> None:
        """Give a table made before claim tokens its ``claim_token`` column (NULL: no claim token)."""
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({self._q})")}
        if columns and "claim_token" not in columns:
            try:
                conn.execute(f"ALTER TABLE {self._q} ADD COLUMN claim_token TEXT")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):  # another process added it first: fine
                    raise TransientError(f"SQLite store busy: {exc}") from exc

    # -- the store protocol ----------------------------------------------

    def setup_infrastructure(self) -> None:
        """Create the table and its indexes if missing."""
        q = self._q
        with self._tx() as conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {q} ("
                " message_id TEXT PRIMARY KEY,"
                " destination TEXT NOT NULL,"
                " body BLOB NOT NULL,"
                " headers TEXT NOT NULL,"
                " due_at_us INTEGER NOT NULL,"
                " available_at_us INTEGER NOT NULL,"
                " failure_count INTEGER NOT NULL DEFAULT 0,"
                " claim_token TEXT)"
            )
            self._add_claim_column(conn)
            conn.execute(f'CREATE INDEX IF NOT EXISTS "ix_{self.table}_due" ON {q}(due_at_us)')
            conn.execute(f'CREATE INDEX IF NOT EXISTS "ix_{self.table}_available" ON {q}(available_at_us)')

    def store(self, message: DelayedMessage) -> None:
        """Insert ``message``; the same message again is a no-op, another under a pending id is refused."""
        self.store_many([message])

    def store_many(self, messages: Sequence[DelayedMessage]) -> None:
        """Insert many messages in one transaction (all or none: a conflicting id refuses the batch)."""
        with self._tx() as conn:
            for m in messages:
                self._insert(conn, m)

    def _insert(self, conn: sqlite3.Connection, message: DelayedMessage) -> None:
        found = conn.execute(f"SELECT {_COLUMNS} FROM {self._q} WHERE message_id = ?", (message.message_id,))
        row = found.fetchone()
        if row is not None:
            try:
                pending = self._message(row)
            except (ValueError, TypeError, OverflowError, RecursionError):
                raise id_conflict(message.message_id) from None
            if not same_message(pending, message):
                raise id_conflict(message.message_id)
            return
        due = _to_us(message.due_at)
        headers = json.dumps(dict(message.headers), ensure_ascii=False)
        conn.execute(
            f"INSERT INTO {self._q} {_INSERT}",
            (message.message_id, message.destination, message.body, headers, due, due, message.failure_count),
        )

    def remove(self, message_id: str, claim: str | None = None) -> bool:
        """Delete; False when already gone, or superseded (the row no longer holds ``claim``)."""
        with self._tx() as conn:
            return self._delete(conn, message_id, claim)

    def remove_many(self, message_ids: Sequence[str], claims: Sequence[str | None] | None = None) -> Sequence[bool]:
        """Delete many in one transaction; one flag per id (with ``claims``: each only while still claimed)."""
        held = list(claims) if claims is not None else [None] * len(message_ids)
        with self._tx() as conn:
            return [self._delete(conn, mid, claim) for mid, claim in zip(message_ids, held, strict=True)]

    def _delete(self, conn: sqlite3.Connection, message_id: str, claim: str | None) -> bool:
        if claim is not None:
            sql = f"DELETE FROM {self._q} WHERE message_id = ? AND claim_token = ?"
            return conn.execute(sql, (message_id, claim)).rowcount > 0
        self._not_in_flight(conn, message_id)
        return conn.execute(f"DELETE FROM {self._q} WHERE message_id = ?", (message_id,)).rowcount > 0

    def _not_in_flight(self, conn: sqlite3.Connection, message_id: str) -> None:
        """Raise ``MessageInFlightError`` while a dispatcher's claim on the row lasts (by this host's clock)."""
        found = conn.execute(
            f"SELECT 1 FROM {self._q} WHERE message_id = ? AND claim_token IS NOT NULL"
            f" AND available_at_us > ? AND available_at_us > due_at_us AND available_at_us <= {_LAST_US}",
            (message_id, _to_us(datetime.now(UTC))),
        ).fetchone()
        if found is not None:
            raise in_flight(message_id)

    def increment_failure_count(self, message_id: str, claim: str | None = None) -> bool:
        """Count a failure and release the claim (its token stays for the settling that follows)."""
        held = "" if claim is None else " AND claim_token = ?"
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE {self._q} SET failure_count = failure_count + 1, available_at_us = due_at_us"
                f" WHERE message_id = ?{held}",
                (message_id,) if claim is None else (message_id, claim),
            )
            return cur.rowcount > 0

    def reschedule(self, message_id: str, due_at: datetime, claim: str | None = None) -> bool:
        """Move the due time and release the claim; refused while a dispatcher holds it (without ``claim``)."""
        due = _to_us(due_at)
        held = "" if claim is None else " AND claim_token = ?"
        with self._tx() as conn:
            if claim is None:
                self._not_in_flight(conn, message_id)
            cur = conn.execute(
                f"UPDATE {self._q} SET due_at_us = ?, available_at_us = ?, claim_token = NULL"
                f" WHERE message_id = ?{held}",
                (due, due, message_id) if claim is None else (due, due, message_id, claim),
            )
            return cur.rowcount > 0

    def next_due(self) -> datetime | None:
        """Earliest time a message becomes fetchable."""
        row = self._conn().execute(f"SELECT MIN(available_at_us) FROM {self._q}").fetchone()
        return None if row is None or row[0] is None else _time_or(row[0], _EPOCH)

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """Atomically claim up to ``limit`` due messages, earliest first (a deferred row names its slot)."""
        if limit < 1:
            return []
        now = _to_us(at)
        until = now + self.claim_timeout_us
        claim = uuid.uuid4().hex
        q = self._q
        with self._tx() as conn:
            rows = conn.execute(
                f"UPDATE {q} SET available_at_us = ?, claim_token = {_CLAIM} WHERE rowid IN ("
                f" SELECT rowid FROM {q} WHERE due_at_us <= ? AND available_at_us <= ? ORDER BY due_at_us LIMIT ?)"
                f" RETURNING rowid, {_COLUMNS}, claim_token",
                (until, claim, claim, now, now, limit),
            ).fetchall()
            if len(rows) < limit:  # rows whose due or claim time is not a time: due now (an index seek each)
                rows += conn.execute(
                    f"UPDATE {q} SET available_at_us = ?, claim_token = ? WHERE rowid IN ("
                    f" SELECT rowid FROM {q} WHERE (due_at_us > {_LAST_US} AND available_at_us <= ?)"
                    f" OR available_at_us > {_LAST_US} LIMIT ?)"
                    f" RETURNING rowid, {_COLUMNS}, claim_token",
                    (until, claim, now, limit - len(rows)),
                ).fetchall()
            messages = [self._claimed(row, at, conn) for row in rows]
        messages.sort(key=lambda m: (m.due_at, m.message_id))
        return messages

    def _claimed(self, row: tuple[object, ...], at: datetime, conn: sqlite3.Connection) -> ClaimedMessage:
        """The message of a claimed ``(rowid, *_COLUMNS, claim_token)`` row, with the slot it was deferred to."""
        token = str(row[-1])
        _, _, slot_us = token.partition("@")
        slot = _from_us(int(slot_us)) if slot_us.isdigit() and int(slot_us) <= _LAST_US else None
        return ClaimedMessage.of(self._read(row[:-1], at, conn), token, slot)

    def defer(self, deferrals: Sequence[tuple[str, datetime, str]]) -> Sequence[bool]:
        """Release each claim, the row fetchable again at its release slot (due time unchanged); one transaction."""
        with self._tx() as conn:
            return [
                conn.execute(
                    f"UPDATE {self._q} SET available_at_us = ?, claim_token = NULL"
                    " WHERE message_id = ? AND claim_token = ?",
                    (max(_to_us(slot), 0), message_id, claim),
                ).rowcount
                > 0
                for message_id, slot, claim in deferrals
            ]

    def release_backlog(self) -> Mapping[str, tuple[int, datetime]]:
        """Deferred rows per destination: how many, and the latest slot among them."""
        rows = (
            self._conn()
            .execute(
                f"SELECT destination, COUNT(*), MAX(available_at_us) FROM {self._q} WHERE claim_token IS NULL"
                f" AND available_at_us > due_at_us AND available_at_us <= {_LAST_US} GROUP BY destination"
            )
            .fetchall()
        )
        return {str(d): (int(n), _time_or(latest, _EPOCH)) for d, n, latest in rows}

    # -- operator helpers --------------------------------------------------

    def get(self, message_id: str) -> DelayedMessage | None:
        """The stored message with this id, claimed or not."""
        row = self._conn().execute(f"SELECT rowid, {_COLUMNS} FROM {self._q} WHERE message_id = ?", (message_id,))
        found = row.fetchone()
        return None if found is None else self._read(found, _EPOCH, None)

    def earliest_due(self) -> datetime | None:
        """The earliest due time, claimed or not."""
        row = self._conn().execute(f"SELECT MIN(due_at_us) FROM {self._q}").fetchone()
        return None if row is None or row[0] is None else _time_or(row[0], _EPOCH)

    def backlog(self, bucket_seconds: int) -> Sequence[tuple[datetime, int]]:
        """Pending counts per due-time bucket, earliest first."""
        size = max(1, int(bucket_seconds)) * 1_000_000
        rows = (
            self._conn()
            .execute(
                f"SELECT (due_at_us / ?) * ? AS bucket, COUNT(*) FROM {self._q} GROUP BY bucket ORDER BY bucket",
                (size, size),
            )
            .fetchall()
        )
        return [(_time_or(b, _EPOCH), int(n)) for b, n in rows]

    def __len__(self) -> int:
        row = self._conn().execute(f"SELECT COUNT(*) FROM {self._q}").fetchone()
        return int(row[0])

    def _read(self, row: tuple[object, ...], at: datetime, conn: sqlite3.Connection | None) -> DelayedMessage:
        """The message in ``(rowid, *_COLUMNS)``, or its unreadable stand-in (with ``conn``: given a usable id)."""
        rowid, message_id, destination, body, _, due_us, _ = row
        try:
            return self._message(row[1:])
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            if conn is not None and not is_usable_message_id(message_id):
                message_id = f"unreadable-{uuid.uuid4().hex}"  # the stand-in's id must find the row
                conn.execute(f"UPDATE {self._q} SET message_id = ? WHERE rowid = ?", (message_id, rowid))
            reason = f"row {rowid} of {self.table}: {type(exc).__name__}: {exc}"
            return unreadable_message(str(message_id), destination, body, _time_or(due_us, at), reason)

    @staticmethod
    def _message(row: tuple[object, ...]) -> DelayedMessage:
        """The message in a row of ``_COLUMNS``; ``ValueError``/``TypeError``/``OverflowError`` when it is garbage."""
        message_id, destination, body, headers, due_us, failures = row
        if not isinstance(body, bytes):
            raise TypeError(f"body is {type(body).__name__}, not a BLOB")
        if not isinstance(headers, str) or not isinstance(due_us, int):
            raise TypeError(
                f"headers ({type(headers).__name__}) or due time ({type(due_us).__name__}) of the wrong type"
            )
        values = json.loads(headers)
        if not isinstance(values, dict):
            raise TypeError(f"headers are a JSON {type(values).__name__}, not an object")
        return DelayedMessage(
            message_id=message_id,  # type: ignore[arg-type]  # checked by the model
            destination=destination,  # type: ignore[arg-type]
            body=body,
            headers=Headers(values),
            due_at=_from_us(due_us),
            failure_count=failures,  # type: ignore[arg-type]
        )
