"""The Azure route (``--cloud azure``): send through the delayed sender; pending, cancel and reschedule exactly on
the endpoint's delays table (native sends of up to 7 days are not in it)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

from delayed_delivery.app.routes.base import (
    CancelRequest,
    CancelResult,
    Capability,
    CloudOptions,
    PendingReport,
    RescheduleRequest,
    RescheduleResult,
    SendResult,
    azure_connection,
    backlog_report,
    require_endpoint,
    resolve_due,
    seconds_until,
)
from delayed_delivery.clock import SystemClock
from delayed_delivery.durations import new_due_time
from delayed_delivery.errors import ConfigurationError, DestinationNotFoundError

if TYPE_CHECKING:
    from delayed_delivery.azure.table_store import TableDelayedMessageStore

__all__ = ["AzureTableRoute"]


class AzureTableRoute:
    """Send through ``AzureDelayedSender``; pending, cancel and reschedule exactly on the endpoint's delays table."""

    name = "azure"
    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    def __init__(self, options: CloudOptions) -> None:
        from delayed_delivery.azure.config import ENV_CONNECTION, ENV_ENDPOINT, AzureClients, AzureDelayedDeliveryConfig

        env = dict(os.environ)
        connection = azure_connection(options.connection_string, options.local)
        if connection:
            env[ENV_CONNECTION] = connection
        if not connection and not env.get("DELAYED_DELIVERY_STORAGE_ACCOUNT") and not env.get("AzureWebJobsStorage"):
            raise ConfigurationError(
                "no storage account: give --connection-string (env DELAYED_DELIVERY_STORAGE_CONNECTION_STRING), "
                "set DELAYED_DELIVERY_STORAGE_ACCOUNT, or use --local for Azurite on 10000-10002"
            )
        self.endpoint = env[ENV_ENDPOINT] = require_endpoint(options.endpoint)
        self.config = AzureDelayedDeliveryConfig.from_env(env)
        self.clients = AzureClients.create(self.config, fail_fast=True)
        self._store: TableDelayedMessageStore | None = None

    @property
    def store(self) -> TableDelayedMessageStore:
        """The endpoint's delays table, with the shard count it records (read on first use)."""
        from delayed_delivery.azure.layout import resolve_shards
        from delayed_delivery.azure.storage_queue import StorageQueueTransport
        from delayed_delivery.azure.table_store import TableDelayedMessageStore

        if self._store is None:
            table = self.clients.tables.get_table_client(self.config.table_name)
            shards = resolve_shards(table, self.config.shards, configured=self.config.shards_configured)
            self._store = TableDelayedMessageStore(
                table,
                shards=shards,
                claim_timeout=self.config.claim_timeout,
                queues=StorageQueueTransport(self.clients.queues),  # cancel/reschedule of placed messages
            )
        return self._store

    def _check_queue(self, name: str) -> None:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        from delayed_delivery.azure.sdk_errors import translate
        from delayed_delivery.naming import validate_azure_queue_name

        validate_azure_queue_name(name)
        try:
            self.clients.queues.get_queue_client(name).get_queue_properties()
        except ResourceNotFoundError:
            raise DestinationNotFoundError(
                f"unknown queue {name!r}: it does not exist in this storage account"
            ) from None
        except AzureError as exc:
            raise translate(exc, f"checking queue {name!r}") from exc

    def _check_table(self) -> None:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        from delayed_delivery.azure.sdk_errors import translate

        try:
            self.clients.tables.get_table_client(self.config.table_name).get_table_access_policy()
        except ResourceNotFoundError:
            raise ConfigurationError(self._no_table()) from None
        except AzureError as exc:
            raise translate(exc, f"checking table {self.config.table_name!r}") from exc

    def _no_table(self) -> str:
        return (
            f"delays table {self.config.table_name!r} of endpoint {self.endpoint!r} does not exist: check --endpoint, "
            "or create it with `delayed-delivery azure setup`"
        )

    def send(
        self,
        to: str,
        body: bytes,
        due: datetime,
        *,
        headers: Mapping[str, str],
        message_id: str | None = None,
        delay: str | None = None,
        cancellable: bool = False,
    ) -> SendResult:
        """Native visibility timeout up to 7 days (unless ``cancellable``), else a row in the delays table."""
        from delayed_delivery.azure.sender import AzureDelayedSender
        from delayed_delivery.azure.storage_queue import MAX_NATIVE_DELAY_SECONDS, StorageQueueTransport

        self._check_queue(to)
        if cancellable or seconds_until(due, delay) > MAX_NATIVE_DELAY_SECONDS:
            self._check_table()  # the table route: say which table is missing before anything is written
        sender = AzureDelayedSender(StorageQueueTransport(self.clients.queues), self.store, self.config.settings)
        at = due if delay is None else None  # a delay counts from the write, not from before the command connected
        result = sender.send(
            to, body, delay=delay, at=at, headers=dict(headers), message_id=message_id, cancellable=cancellable
        )
        return SendResult(
            result.message_id,
            f"azure-{result.route}",
            to,
            result.due_at,
            cloud="azure",
            table=self.config.table_name if result.route == "table" else None,
        )

    def pending(self, bucket_seconds: int, *, queue: str | None = None) -> PendingReport:
        """Exact: every due row of the delays table, bucketed by due time (reads the due rows' keys only)."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        from delayed_delivery.azure import rows
        from delayed_delivery.azure.sdk_errors import translate

        _ = self.store  # a process set to another shard count than the table's is refused, as for every command
        buckets: Counter[datetime] = Counter()
        earliest: datetime | None = None
        total = claimed = placed = 0
        table = self.clients.tables.get_table_client(self.config.table_name)
        try:
            for entity in table.query_entities(
                "RowKey ge @lo and RowKey lt @hi",
                parameters={"lo": rows.DUE_PREFIX, "hi": rows.DUE_END},
                select=["RowKey", "AvailableAt"],
                results_per_page=1000,
            ):
                key = str(entity["RowKey"])[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20]
                due = rows.from_due_key(key)
                total += 1
                available = str(entity.get("AvailableAt", key))
                if available == rows.PLACED_KEY:
                    placed += 1  # on its queue, hidden until due: counted, and cancellable by its pop receipt
                elif available > key:
                    claimed += 1
                earliest = due if earliest is None or due < earliest else earliest
                start = datetime.fromtimestamp(due.timestamp() // bucket_seconds * bucket_seconds, tz=due.tzinfo)
                buckets[start] += 1
        except ResourceNotFoundError:
            raise ConfigurationError(self._no_table()) from None
        except AzureError as exc:
            raise translate(exc, f"reading table {self.config.table_name!r}") from exc
        return backlog_report(
            buckets,
            earliest,
            pending=total,
            route="azure-table",
            cloud="azure",
            table=self.config.table_name,
            claimed_or_retrying=claimed,
            placed=placed,
            error_queue=self.config.settings.error_queue,
            error_queue_messages=self._error_queue_depth(),
            limits="table-routed messages only; native ones (≤ 7 days, not cancellable) wait in their queue, "
            "invisible, and are not counted here",
        )

    def _error_queue_depth(self) -> int | None:
        """Approximate messages in the error queue (None when it does not exist or cannot be read)."""
        from azure.core.exceptions import AzureError

        try:
            properties = self.clients.queues.get_queue_client(self.config.settings.error_queue).get_queue_properties()
        except AzureError:
            return None
        return int(properties.approximate_message_count or 0)

    def cancel(self, request: CancelRequest) -> CancelResult:
        """Delete the message's rows (exact)."""
        self._check_table()
        return CancelResult(request.message_id, "azure", cancelled=self.store.remove(request.message_id))

    def reschedule(self, request: RescheduleRequest) -> RescheduleResult:
        """Move the message's due row (exact, one transaction)."""
        self._check_table()
        now = SystemClock().now()  # after connecting: a delay counts from the write
        moment = new_due_time(resolve_due(request.due, now), now)
        moved = self.store.reschedule(request.message_id, moment)
        return RescheduleResult(request.message_id, "azure", moment, moved=moved)
