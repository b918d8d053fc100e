"""Migration targets behind one small protocol, chosen by a target URL.

A target is built on each executor from a picklable ``TargetSpec`` and receives batches of
``DelayedMessage`` values whose ids are the legacy ids, so writing the same batch again replaces
rather than duplicates. URL forms:

``sqlite:PATH`` or ``sqlite:///relative.db`` / ``sqlite:////abs.db`` (the ``--store`` convention), ``?table=NAME``
    The embedded SQLite store (``SqliteDelayedMessageStore``), one transaction per batch.
``postgresql://user@host/db[?table=NAME&schema=NAME&…libpq options]``
    The PostgreSQL store (``PostgresDelayedMessageStore.store_many``). The password is masked in the
    run's recorded arguments; prefer ``PGPASSWORD`` or a ``.pgpass`` file.
``azure-table:TABLE[?shards=N&connection_env=VAR]``
    The Azure delays table (``TableDelayedMessageStore.store_many``: entity-group transactions per
    partition, deterministic row keys, so a rerun replaces). The connection string is read on the
    driver from ``VAR`` (default ``DELAYED_DELIVERY_STORAGE_CONNECTION_STRING``) and shipped to the
    executors with the job; it is never recorded in the run's files.

``sqs:REGION[?endpoint_url=URL]``
    SQS through the AWS adapter's sender (credentials from the usual boto3 chain on each executor).
    A message already due is sent with no delay. Not undoable.

In every store a message already due is stored with its past due time; the dispatcher's next fetch
(``due_at <= now``) delivers it at once. Undo removes the ids a run wrote (those already delivered are
gone and are reported as such).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ConfigurationError
from ..headers import HEADER_PREFIX
from ..model import DelayedMessage
from ..sqlite_store import SqliteDelayedMessageStore

__all__ = ["TARGET_FACTORIES", "MigrationTarget", "SqliteTarget", "SqsTarget", "StoreTarget", "TargetSpec"]

#: Where the Azure target reads its connection string unless ``connection_env`` names another variable.
DEFAULT_AZURE_CONNECTION_ENV = "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING"


@runtime_checkable
class MigrationTarget(Protocol):
    """Where migrated messages are written."""

    #: Whether ``undo`` can take back what was written.
    can_undo: bool

    def prepare(self) -> None:
        """Create tables or queues if missing; safe to call from every executor."""
        ...

    def write(self, messages: Sequence[DelayedMessage]) -> Sequence[tuple[str, str]]:
        """Write one batch; writing the same ids again overwrites them where the target can.

        Returns (message id, reason) for each message the target refused for good (never retryable
        failures, which raise); the job records them as refusals instead of failing the run.
        """
        ...

    def undo(self, message_ids: Sequence[str]) -> int:
        """Remove what was written under these ids; the number actually removed."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A parsed target URL: ``scheme:location?key=value``; picklable, so executors build their own target."""

    scheme: str
    location: str
    options: tuple[tuple[str, str], ...] = ()
    #: Credentials resolved on the driver (connection string, database URL); never printed or recorded.
    secret: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, url: str) -> TargetSpec:
        """Parse ``scheme:location[?k=v&…]``; raise ConfigurationError for an unknown scheme."""
        scheme, sep, rest = url.partition(":")
        scheme = "postgresql" if scheme == "postgres" else scheme
        if not sep or scheme not in TARGET_FACTORIES:
            raise ConfigurationError(
                f"unknown target {url!r}: use sqlite:PATH, postgresql://…, azure-table:TABLE or sqs:REGION "
                "(see docs/pipelines.md)"
            )
        if scheme == "postgresql":
            return cls._postgres(url)
        location, _, query = rest.partition("?")
        if scheme == "sqlite" and location.startswith("///"):
            location = location[3:]
        if not location:
            raise ConfigurationError(f"target {url!r} has no location after {scheme}:")
        spec = cls(scheme, location, tuple(sorted(parse_qsl(query, keep_blank_values=True))))
        if scheme == "azure-table":
            env = spec.option("connection_env") or DEFAULT_AZURE_CONNECTION_ENV
            secret = os.environ.get(env, "").strip()
            if not secret:
                raise ConfigurationError(f"the azure-table target needs a connection string in ${env}")
            spec = cls(spec.scheme, spec.location, spec.options, secret)
        return spec

    @classmethod
    def _postgres(cls, url: str) -> TargetSpec:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        mine = tuple(sorted((k, query.pop(k)) for k in ("table", "schema") if k in query))
        conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(query), ""))
        shown = parts.netloc
        if parts.password is not None:
            shown = shown.replace(":" + parts.password + "@", ":***@", 1)
        return cls("postgresql", "//" + shown + parts.path, mine, conninfo)

    def option(self, key: str, default: str | None = None) -> str | None:
        """One ``?key=value`` option."""
        return dict(self.options).get(key, default)

    @property
    def url(self) -> str:
        """The URL again, options sorted (stable, used in the run fingerprint)."""
        query = "&".join(f"{k}={v}" for k, v in self.options)
        return f"{self.scheme}:{self.location}" + (f"?{query}" if query else "")

    def build(self) -> MigrationTarget:
        """Construct the target this spec names."""
        return TARGET_FACTORIES[self.scheme](self)


class SqliteTarget:
    """The embedded SQLite store: one ``store_many`` transaction per batch; undo removes by id."""

    can_undo = True

    def __init__(self, path: str, table: str = "delayed_messages") -> None:
        self.store = SqliteDelayedMessageStore(path, table=table, busy_timeout=120.0)

    def prepare(self) -> None:
        """Create the table if missing."""
        self.store.setup_infrastructure()

    def write(self, messages: Sequence[DelayedMessage]) -> Sequence[tuple[str, str]]:
        """INSERT OR REPLACE the batch in one transaction."""
        if messages:
            self.store.store_many(messages)
        return ()

    def undo(self, message_ids: Sequence[str]) -> int:
        """Delete the ids; count those that were still there."""
        return sum(1 for removed in self.store.remove_many(message_ids) if removed) if message_ids else 0

    def close(self) -> None:
        """Close the connections."""
        self.store.close()


class StoreTarget:
    """Any store with ``store_many`` and ``remove_many`` (PostgreSQL, the Azure table), used through its own API."""

    can_undo = True

    def __init__(self, store: Any) -> None:
        self.store = store

    def prepare(self) -> None:
        """Create the table if missing."""
        self.store.setup_infrastructure()

    def write(self, messages: Sequence[DelayedMessage]) -> Sequence[tuple[str, str]]:
        """Store the batch with the store's own batching."""
        if messages:
            self.store.store_many(messages)
        return ()

    def undo(self, message_ids: Sequence[str]) -> int:
        """Remove the ids; count those that were still there."""
        return sum(1 for removed in self.store.remove_many(message_ids) if removed) if message_ids else 0

    def close(self) -> None:
        """Close the store's connections if it has any."""
        close = getattr(self.store, "close", None)
        if callable(close):
            close()


class SqsTarget:
    """SQS through the AWS adapter's ``SqsDelayedSender``: native ``DelaySeconds`` up to 900 s, ``-delay.fifo`` beyond.

    The body must be UTF-8 text and the headers become message attributes (at most 10, or 9 on the FIFO
    route); the migration's own ``DelayedDelivery.*`` marker headers are not sent (SQS reserves that
    prefix for the product). A message SQS cannot take is refused, not fatal. SQS cannot take back a
    sent message, so ``abort`` cannot undo this target.
    """

    can_undo = False
    undo_note = (
        "SQS cannot take back a sent message: the run's sent batches are listed in its ledger; "
        "messages on the -delay.fifo queues could only be purged together with everything else on them"
    )

    def __init__(self, region: str, endpoint_url: str | None = None) -> None:
        import boto3

        from ..aws.sender import SqsDelayedSender

        client = boto3.client("sqs", region_name=region, endpoint_url=endpoint_url)
        self.sender = SqsDelayedSender(client)

    def prepare(self) -> None:
        """Nothing to create: destinations and their ``-delay.fifo`` queues belong to the receivers."""

    def write(self, messages: Sequence[DelayedMessage]) -> Sequence[tuple[str, str]]:
        """Send the batch (SendMessageBatch per queue); refuse messages SQS can never take."""
        from ..aws.sender import DelayedSend
        from ..errors import DelayedDeliveryError

        now = datetime.now(UTC)
        refused: list[tuple[str, str]] = []
        sends: list[DelayedSend] = []
        for m in messages:
            try:
                body = m.body.decode("utf-8")
            except UnicodeDecodeError:
                refused.append((m.message_id, "SQS bodies are text: the body is not UTF-8"))
                continue
            attributes = {k: v for k, v in m.headers.items() if not k.startswith(HEADER_PREFIX)}
            sends.append(DelayedSend(m.destination, body, m.delay_from(now), attributes or None, m.message_id))
        try:
            result = self.sender.send_delayed_batch(sends)
        except DelayedDeliveryError as exc:
            if exc.retryable:
                raise
            return refused + self._one_by_one(sends)  # some message is invalid: find which
        for message_id, error in result.failures.items():
            if error.retryable:
                raise error
            refused.append((message_id, str(error)))
        return refused

    def _one_by_one(self, sends: Sequence[Any]) -> list[tuple[str, str]]:
        from ..errors import DelayedDeliveryError

        refused: list[tuple[str, str]] = []
        for send in sends:
            try:
                self.sender.send_delayed(
                    send.destination, send.body, send.delay, attributes=send.attributes, message_id=send.message_id
                )
            except DelayedDeliveryError as exc:
                if exc.retryable:
                    raise
                refused.append((send.message_id, str(exc)))
        return refused

    def undo(self, message_ids: Sequence[str]) -> int:
        """SQS cannot take back a sent message."""
        raise ConfigurationError(self.undo_note)

    def close(self) -> None:
        """Nothing to release."""


def _sqs(spec: TargetSpec) -> MigrationTarget:
    try:
        return SqsTarget(spec.location, spec.option("endpoint_url"))
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError("the sqs target needs the aws extra: pip install '.[aws]'") from exc


def _sqlite(spec: TargetSpec) -> MigrationTarget:
    return SqliteTarget(spec.location, table=spec.option("table") or "delayed_messages")


def _postgres(spec: TargetSpec) -> MigrationTarget:
    try:
        from ..postgres.store import PostgresDelayedMessageStore
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError("the postgresql target needs the postgres extra: pip install '.[postgres]'") from exc
    kwargs: dict[str, Any] = {"schema": spec.option("schema") or "public"}
    if spec.option("table"):
        kwargs["table"] = spec.option("table")
    return StoreTarget(PostgresDelayedMessageStore(spec.secret or "", **kwargs))


def _azure_table(spec: TargetSpec) -> MigrationTarget:
    try:
        from ..azure.table_store import TableDelayedMessageStore
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError("the azure-table target needs the azure extra: pip install '.[azure]'") from exc
    try:
        shards = int(spec.option("shards") or "1")
    except ValueError:
        raise ConfigurationError(f"azure-table shards must be an integer, got {spec.option('shards')!r}") from None
    return StoreTarget(TableDelayedMessageStore.from_connection_string(spec.secret or "", spec.location, shards=shards))


#: Target URL scheme → factory. Adapters that need an SDK import it inside their factory.
TARGET_FACTORIES: dict[str, Callable[[TargetSpec], MigrationTarget]] = {
    "sqlite": _sqlite,
    "postgresql": _postgres,
    "azure-table": _azure_table,
    "sqs": _sqs,
}
