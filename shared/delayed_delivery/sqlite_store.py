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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from .clock import utc
from .errors import ConfigurationError, TransientError
from .model import DelayedMessage, Headers, is_usable_message_id, unreadable_message
from .ports import DelayedMessageStore

__all__ = ["SqliteDelayedMessageStore"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMNS = "message_id, destination, body, headers, due_at_us, failure_count"


def _to_us(value: datetime) -> int:
    delta = utc(value) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


#: Microseconds of the first and last datetimes; SQLite sorts text and blobs after every number.
_FIRST_US = _to_us(datetime.min.replace(tzinfo=UTC))
_LAST_US = _to_us(datetime.max.replace(tzinfo=UTC))


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
                " failure_count INTEGER NOT NULL DEFAULT 0)"
            )
            conn.execute(f'CREATE INDEX IF NOT EXISTS "ix_{self.table}_due" ON {q}(due_at_us)')
            conn.execute(f'CREATE INDEX IF NOT EXISTS "ix_{self.table}_available" ON {q}(available_at_us)')

    def store(self, message: DelayedMessage) -> None:
        """Insert or replace ``message``."""
        due = _to_us(message.due_at)
        with self._tx() as conn:
            conn.execute(
                f"INSERT OR REPLACE INTO {self._q} VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    message.message_id,
                    message.destination,
                    message.body,
                    json.dumps(dict(message.headers), ensure_ascii=False),
                    due,
                    due,
                    message.failure_count,
                ),
            )

    def store_many(self, messages: Sequence[DelayedMessage]) -> None:
        """Insert or replace many messages in one transaction."""
        rows = [
            (
                m.message_id,
                m.destination,
                m.body,
                json.dumps(dict(m.headers), ensure_ascii=False),
                _to_us(m.due_at),
                _to_us(m.due_at),
                m.failure_count,
            )
            for m in messages
        ]
        with self._tx() as conn:
            conn.executemany(f"INSERT OR REPLACE INTO {self._q} VALUES (?, ?, ?, ?, ?, ?, ?)", rows)

    def remove(self, message_id: str) -> bool:
        """Delete; False when already gone."""
        with self._tx() as conn:
            return conn.execute(f"DELETE FROM {self._q} WHERE message_id = ?", (message_id,)).rowcount > 0

    def remove_many(self, message_ids: Sequence[str]) -> Sequence[bool]:
        """Delete many in one transaction; one flag per id."""
        with self._tx() as conn:
            return [
                conn.execute(f"DELETE FROM {self._q} WHERE message_id = ?", (mid,)).rowcount > 0 for mid in message_ids
            ]

    def increment_failure_count(self, message_id: str) -> bool:
        """Count a failure and release the claim."""
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE {self._q} SET failure_count = failure_count + 1, available_at_us = due_at_us"
                " WHERE message_id = ?",
                (message_id,),
            )
            return cur.rowcount > 0

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        """Move the due time and release the claim."""
        due = _to_us(due_at)
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE {self._q} SET due_at_us = ?, available_at_us = ? WHERE message_id = ?",
                (due, due, message_id),
            )
            return cur.rowcount > 0

    def next_due(self) -> datetime | None:
        """Earliest time a message becomes fetchable."""
        row = self._conn().execute(f"SELECT MIN(available_at_us) FROM {self._q}").fetchone()
        return None if row is None or row[0] is None else _time_or(row[0], _EPOCH)

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """Atomically claim up to ``limit`` due messages, earliest first."""
        if limit < 1:
            return []
        now = _to_us(at)
        until = now + self.claim_timeout_us
        q = self._q
        with self._tx() as conn:
            rows = conn.execute(
                f"UPDATE {q} SET available_at_us = ? WHERE rowid IN ("
                f" SELECT rowid FROM {q} WHERE due_at_us <= ? AND available_at_us <= ? ORDER BY due_at_us LIMIT ?)"
                f" RETURNING rowid, {_COLUMNS}",
                (until, now, now, limit),
            ).fetchall()
            if len(rows) < limit:  # rows whose due or claim time is not a time: due now (an index seek each)
                rows += conn.execute(
                    f"UPDATE {q} SET available_at_us = ? WHERE rowid IN ("
                    f" SELECT rowid FROM {q} WHERE (due_at_us > {_LAST_US} AND available_at_us <= ?)"
                    f" OR available_at_us > {_LAST_US} LIMIT ?)"
                    f" RETURNING rowid, {_COLUMNS}",
                    (until, now, limit - len(rows)),
                ).fetchall()
            messages = [self._read(row, at, conn) for row in rows]
        messages.sort(key=lambda m: (m.due_at, m.message_id))
        return messages

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
