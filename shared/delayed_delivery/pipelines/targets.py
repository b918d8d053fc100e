"""Migration targets behind one small protocol, chosen by a target URL.

A target is built on each executor from a picklable ``TargetSpec`` and receives batches of ``DelayedMessage`` values
whose ids are the legacy ids, so writing the same batch again replaces rather than duplicates. URL forms:

``sqlite:PATH`` or ``sqlite:///relative.db`` / ``sqlite:////abs.db`` (the ``--store`` convention), ``?table=NAME``
    The embedded SQLite store (``SqliteDelayedMessageStore`` behind ``StoreTarget``), one transaction per batch.
``postgresql://user@host/db[?table=NAME&schema=NAME&…libpq options]``
    The PostgreSQL store (``PostgresDelayedMessageStore`` behind ``StoreTarget``). The password is masked in the
    run's recorded arguments; prefer ``PGPASSWORD`` or a ``.pgpass`` file.
``azure-table:TABLE[?shards=N&in_flight=K&connection_env=VAR]``
    The Azure delays table (``AzureTableTarget``): the table's own row design (``azure/rows.py``), written in full
    entity-group transactions (50 messages, 100 operations, one partition each), up to ``K`` (default 4) in flight
    per executor on one pooled HTTP connection set. Row keys are deterministic, so a rerun replaces. The job sorts
    each batch by shard first (``sort_expression``) so that transactions are full. The connection string is read on
    the driver from ``VAR`` (default ``DELAYED_DELIVERY_STORAGE_CONNECTION_STRING``) and shipped to the executors
    with the job; it is never recorded in the run's files.

``sqs:REGION[?endpoint_url=URL]``
    SQS through the AWS adapter's sender (credentials from the usual boto3 chain on each executor).
    A message already due is sent with no delay. Not undoable.
``s3buckets:BUCKET[?prefix=P&endpoint_url=URL&region=R]``
    The S3 time-bucket tier, one object per bucket (``bucket_target.BucketTarget``). Not undoable.

In every store a message already due is stored with its past due time; the dispatcher's next fetch (``due_at <= now``)
delivers it at once. Undo removes the ids a run wrote (those already delivered are gone and are reported as such).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ConfigurationError, extra_missing
from ..model import DelayedMessage
from ..sqlite_store import SqliteDelayedMessageStore
from .azure_target import AzureTableTarget
from .bucket_target import BUCKET_SCHEME, build_bucket_target
from .sqs_target import SqsTarget

__all__ = [
    "TARGET_FACTORIES",
    "AzureTableTarget",
    "MigrationStore",
    "MigrationTarget",
    "SqsTarget",
    "StoreTarget",
    "TargetSpec",
]

#: Where the Azure target reads its connection string unless ``connection_env`` names another variable.
DEFAULT_AZURE_CONNECTION_ENV = "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING"


@runtime_checkable
class MigrationTarget(Protocol):
    """Where migrated messages are written."""

    #: Whether ``undo`` can take back what was written.
    can_undo: bool
    #: Record progress in the ledger after every this many rows (0: once per batch). Targets that cannot
    #: overwrite (SQS standard queues) set it, so a killed run resends at most this many messages.
    checkpoint_rows: int

    def prepare(self) -> None:
        """Create tables or queues if missing; safe to call from every executor."""
        ...

    def write(self, messages: Sequence[DelayedMessage]) -> Sequence[tuple[str, str]]:
        """Write one batch; writing the same ids again overwrites them where the target can.

        Returns (message id, reason) for each message the target refused for good (never retryable
        failures, which raise); the job records them as refusals instead of failing the run.
        """
        ...

    def flush(self) -> None:
        """Finish what ``write`` buffered; the job calls it before recording a batch as completed."""
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
                f"unknown target {url!r}: use sqlite:PATH, postgresql://…, azure-table:TABLE, sqs:REGION or "
                "s3buckets:BUCKET (see docs/pipelines.md)"
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

    def sort_expression(self) -> str | None:
        """A Spark SQL expression over ``message_id`` the job sorts each batch by, so writes group well.

        For the Azure table it is the shard (``rows.shard_of``: the first 8 hex digits of the id's
        SHA-1, modulo the shard count), so consecutive rows share a partition and fill transactions.
        """
        if self.scheme == "azure-table":
            return f"pmod(cast(conv(substring(sha1(message_id), 1, 8), 16, 10) as bigint), {self.shards()})"
        return None

    def shards(self) -> int:
        """The ``shards`` option of an Azure table target (1 when absent)."""
        try:
            shards = int(self.option("shards") or "1")
        except ValueError:
            raise ConfigurationError(f"azure-table shards must be an integer, got {self.option('shards')!r}") from None
        if not 1 <= shards <= 1000:
            raise ConfigurationError(f"azure-table shards must be from 1 to 1000, got {shards}")
        return shards


class MigrationStore(Protocol):
    """A store a migration writes through its own API: bulk writes, bulk removes, its own tables."""

    def setup_infrastructure(self) -> None:
        """Create the table if missing."""
        ...

    def store_many(self, messages: Sequence[DelayedMessage]) -> None:
        """Write the messages in one batch, replacing any with the same id."""
        ...

    def remove_many(self, message_ids: Sequence[str]) -> Sequence[bool]:
        """Delete the ids; one flag per id, False when it was already gone."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class StoreTarget:
    """A store written through its own ``store_many`` (SQLite, PostgreSQL): one batch per call; undo removes by id."""

    can_undo = True
    checkpoint_rows = 0

    def __init__(self, store: MigrationStore) -> None:
        self.store = store

    def prepare(self) -> None:
        """Create the table if missing."""
        self.store.setup_infrastructure()

    def write(self, messages: Sequence[DelayedMessage]) -> Sequence[tuple[str, str]]:
        """Store the batch in one transaction; refuse repeated ids and ids pending with other content (rejects)."""
        from ..errors import MessageIdConflictError
        from .batches import one_per_id

        unique, refused = one_per_id(messages)
        if not unique:
            return refused
        try:
            self.store.store_many(unique)
        except MessageIdConflictError:  # the batch changed nothing: store one by one, refusing the conflicts
            for m in unique:
                try:
                    self.store.store_many([m])
                except MessageIdConflictError as exc:
                    refused.append((m.message_id, str(exc)))
        return refused

    def flush(self) -> None:
        """Nothing buffered: every ``write`` is acknowledged when it returns."""

    def undo(self, message_ids: Sequence[str]) -> int:
        """Remove the ids; count those that were still there."""
        return sum(1 for removed in self.store.remove_many(message_ids) if removed) if message_ids else 0

    def close(self) -> None:
        """Close the store's connections."""
        self.store.close()


def _sqs(spec: TargetSpec) -> MigrationTarget:
    try:
        return SqsTarget(spec.location, spec.option("endpoint_url"))
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise extra_missing("the sqs target", "spark", "aws") from exc


def _sqlite(spec: TargetSpec) -> MigrationTarget:
    table = spec.option("table") or "delayed_messages"
    return StoreTarget(SqliteDelayedMessageStore(spec.location, table=table, busy_timeout=120.0))


def _postgres(spec: TargetSpec) -> MigrationTarget:
    try:
        from ..postgres.store import PostgresDelayedMessageStore
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise extra_missing("the postgresql target", "spark", "postgres") from exc
    kwargs: dict[str, Any] = {"schema": spec.option("schema") or "public"}
    if spec.option("table"):
        kwargs["table"] = spec.option("table")
    return StoreTarget(PostgresDelayedMessageStore(spec.secret or "", **kwargs))


def _azure_table(spec: TargetSpec) -> MigrationTarget:
    try:
        import azure.data.tables  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise extra_missing("the azure-table target", "spark", "azure") from exc
    try:
        in_flight = int(spec.option("in_flight") or "4")
    except ValueError:
        raise ConfigurationError(
            f"azure-table in_flight must be an integer, got {spec.option('in_flight')!r}"
        ) from None
    return AzureTableTarget(spec.secret or "", spec.location, shards=spec.shards(), in_flight=in_flight)


#: Target URL scheme → factory. Adapters that need an SDK import it inside their factory.
TARGET_FACTORIES: dict[str, Callable[[TargetSpec], MigrationTarget]] = {
    "sqlite": _sqlite,
    "postgresql": _postgres,
    "azure-table": _azure_table,
    "sqs": _sqs,
    BUCKET_SCHEME: build_bucket_target,
}
