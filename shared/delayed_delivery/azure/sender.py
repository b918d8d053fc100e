"""Send delayed messages to Azure Storage Queues: natively when the queue can hold the delay, else via the table.

Routing: a delay of at most 7 days (``max_native_delay``) is one Put Message with that visibility
timeout (rounded up: never early) and a time-to-live that never expires, unless ``cancellable=True``.
Longer delays, and cancellable messages, become rows in the delays table, dispatched by the Function.
With ``settings.enabled`` False such sends raise ``DelayedDeliveryDisabledError``. A sender built without
``settings`` reads them from the ``DELAYED_DELIVERY_*`` environment when it is built.

Headers named ``DelayedDelivery.*`` (any case) are reserved and refused, naming the header.

Every message is validated first (queue name, body type, envelope ≤ 64 KiB, entity ≤ 1 MiB, duplicate
ids in a batch): on bad input nothing is written.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from .. import logfields as lf
from ..clock import Clock, SystemClock
from ..dispatcher import ensure_enabled
from ..durations import Delay
from ..errors import DelayedDeliveryError, InvalidMessageError, batch_failure
from ..model import DelayedMessage
from ..naming import validate_azure_queue_name
from ..settings import DelayedDeliverySettings
from . import rows
from .config import AzureClients, AzureDelayedDeliveryConfig
from .layout import Layout, table_layout
from .storage_queue import MAX_NATIVE_DELAY_SECONDS, StorageQueueTransport, encode_envelope
from .table_store import TableDelayedMessageStore

_log = logging.getLogger(__name__)

__all__ = ["AzureDelayedSender", "DelayRequest", "Route", "SendResult", "send_delayed"]

Route = Literal["native", "table"]


@dataclass(frozen=True, slots=True)
class DelayRequest:
    """One message to send later (give exactly one of ``delay`` and ``at``)."""

    destination: str
    body: bytes
    delay: Delay | None = None
    at: datetime | None = None
    headers: Mapping[str, str] | None = None
    message_id: str | None = None
    cancellable: bool = False


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a message went and when it is due."""

    message_id: str
    destination: str
    due_at: datetime
    route: Route


class AzureDelayedSender:
    """Holds the SDK clients; ``send`` one message or ``send_many``, ``cancel`` a table-routed one."""

    def __init__(
        self,
        transport: StorageQueueTransport,
        store: TableDelayedMessageStore,
        settings: DelayedDeliverySettings | None = None,
        *,
        clock: Clock | None = None,
        max_native_delay: float = MAX_NATIVE_DELAY_SECONDS,
        concurrency: int = 16,
    ) -> None:
        if not 0 <= max_native_delay <= MAX_NATIVE_DELAY_SECONDS:
            raise InvalidMessageError(f"max_native_delay must be within 0..{MAX_NATIVE_DELAY_SECONDS} seconds")
        self.transport = transport
        self.store = store
        #: Without explicit settings the DELAYED_DELIVERY_* environment applies, read now (never at import).
        self.settings = settings if settings is not None else DelayedDeliverySettings.from_env(os.environ)
        self.clock = clock or SystemClock()
        self.max_native_delay = max_native_delay
        self.concurrency = max(1, concurrency)
        #: Set while the table's shard count is not known yet (``from_config`` before the table existed).
        self._layout: Callable[[], Layout] | None = None

    @classmethod
    def from_config(cls, config: AzureDelayedDeliveryConfig, clients: AzureClients | None = None) -> AzureDelayedSender:
        """A sender for the endpoint described by ``config``, with the shard count its delays table records.

        One read of the table at start-up (``layout.resolve_shards``): ``ConfigurationError`` when
        ``DELAYED_DELIVERY_SHARDS`` is set to another count.
        """
        clients = clients or AzureClients.create(config)
        table = clients.tables.get_table_client(config.table_name)
        layout = table_layout(table, config.shards, configured=config.shards_configured)
        transport = StorageQueueTransport(clients.queues)
        store = TableDelayedMessageStore(
            table, shards=layout.shards, claim_timeout=config.claim_timeout, queues=transport
        )  # with the queues: cancel and reschedule of placed messages by their pop receipts
        sender = cls(transport, store, config.settings)
        if not layout.recorded:  # no table yet: ask again before the first row is written (setup may record another)
            sender._layout = lambda: table_layout(table, config.shards, configured=config.shards_configured)
        return sender

    def send(
        self,
        destination: str,
        body: bytes,
        *,
        delay: Delay | None = None,
        at: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        cancellable: bool = False,
    ) -> SendResult:
        """Deliver ``body`` to queue ``destination`` after ``delay`` (or at ``at``)."""
        request = DelayRequest(destination, body, delay, at, headers, message_id, cancellable)
        return self.send_many([request])[0]

    def send_many(self, requests: Sequence[DelayRequest]) -> list[SendResult]:
        """Send many: all validated before anything is written; table rows in transactions per partition.

        Every native send is attempted; when some fail (e.g. a queue that does not exist), one error names
        exactly those messages (``batch_failure``), so the caller resends only them.
        """
        planned = [self._plan(r) for r in requests]
        ids = [m.message_id for m, _, _ in planned]
        if len(set(ids)) != len(ids):
            raise InvalidMessageError("a batch must not contain the same message id twice")
        table = [m for m, route, _ in planned if route == "table"]
        if table:
            ensure_enabled(self.settings)
            self._learn_shards()
        native = [(m, seconds) for m, route, seconds in planned if route == "native"]
        if table:
            self.store.store_many(table)
        failures: dict[str, DelayedDeliveryError] = {}

        sent_at = self.clock.now()

        def send(message: DelayedMessage, seconds: int) -> None:
            try:
                self.transport.send(message, visibility_timeout=seconds, route="native", sent_at=sent_at)
            except DelayedDeliveryError as exc:
                failures[message.message_id] = exc

        if len(native) == 1:
            send(*native[0])
        elif native:
            with ThreadPoolExecutor(min(self.concurrency, len(native))) as pool:
                list(pool.map(lambda ms: send(*ms), native))
        if failures:
            raise batch_failure({m: failures[m] for m in ids if m in failures}, len(planned))
        for message, route, seconds in planned:  # the report's delay bands: due time and delay, from the sender
            _log.info(
                "stored",
                extra={
                    lf.CLOUD: "azure",
                    lf.EVENT: lf.EVENT_STORED,
                    lf.MESSAGE_ID: message.message_id,
                    lf.DESTINATION: message.destination,
                    lf.DUE_AT: message.due_at.isoformat(),
                    lf.DELAY_S: seconds,
                    lf.ROUTE: route,
                },
            )
        return [SendResult(m.message_id, m.destination, m.due_at, route) for m, route, _ in planned]

    def cancel(self, message_id: str) -> bool:
        """Delete a table-routed message before it is dispatched; False when it is gone (or was native)."""
        return self.store.remove(message_id)

    def _plan(self, request: DelayRequest) -> tuple[DelayedMessage, Route, int]:
        if not isinstance(request, DelayRequest):
            raise InvalidMessageError(f"expected DelayRequest, got {type(request).__name__}")
        validate_azure_queue_name(request.destination)
        message = DelayedMessage.create(
            request.destination,
            request.body,
            delay=request.delay,
            at=request.at,
            headers=request.headers,
            message_id=request.message_id,
            clock=self.clock,
        )
        encode_envelope(message)  # refuses what no queue could ever deliver
        seconds = math.ceil(message.delay_from(self.clock.now()))
        if not request.cancellable and seconds <= self.max_native_delay:
            return message, "native", seconds
        ensure_enabled(self.settings)
        rows.to_entities(message, 0)  # entity-size check before anything is written
        return message, "table", seconds

    def _learn_shards(self) -> None:
        """Before the first row: the shard count of a table that did not exist when this sender was made."""
        if self._layout is None:
            return
        layout = self._layout()
        if layout.recorded:
            self._layout = None
        if layout.shards != self.store.shards:
            self.store = TableDelayedMessageStore(
                self.store.table,
                shards=layout.shards,
                claim_timeout=self.store.claim_timeout.total_seconds(),
                queues=self.store.placed_queues,
            )


def send_delayed(
    connection_string: str,
    destination: str,
    body: bytes,
    *,
    endpoint: str,
    delay: Delay | None = None,
    at: datetime | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: str | None = None,
    cancellable: bool = False,
    table_name: str | None = None,
    settings: DelayedDeliverySettings | None = None,
) -> SendResult:
    """One-call form: send ``body`` to ``destination`` later, using ``endpoint``'s delays table if needed."""
    config = AzureDelayedDeliveryConfig.for_endpoint(
        endpoint,
        table_name=table_name,
        connection_string=connection_string,
        settings=settings if settings is not None else DelayedDeliverySettings.from_env(os.environ),
    )
    sender = AzureDelayedSender.from_config(config)
    return sender.send(
        destination, body, delay=delay, at=at, headers=headers, message_id=message_id, cancellable=cancellable
    )
