"""Copy this: an Azure Functions queue trigger that reads what delayed delivery put on a Storage Queue.

Put it in your own function app's ``function_app.py`` (azure-functions and ``delayed-delivery[azure]`` in its
requirements). Set ``ORDERS_QUEUE`` to the queue name and ``DelayedDeliveryQueues__queueServiceUri`` (managed
identity, with Storage Queue Data Reader and Message Processor on the queue) or ``DelayedDeliveryQueues`` (a
connection string). In host.json, ``extensions.queues.messageEncoding`` must be ``"none"``: the envelope is JSON
text, not base64. With ``IDEMPOTENCY_CONNECTION`` (a connection string) each message id is processed once, in the
table ``IDEMPOTENCY_TABLE`` (default ``processed``). The dispatcher's own app registers the same consumer, without
that table, when ``deployExampleConsumer`` is on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import cache

import azure.functions as func

from delayed_delivery.azure.idempotency import TableProcessedLog, effectively_once
from delayed_delivery.azure.receive import delivered_from_queue_message, observe_lateness
from delayed_delivery.delivery import DeliveredMessage

app = func.FunctionApp()
_log = logging.getLogger("delayed_delivery.consumer")


def process(delivered: DeliveredMessage) -> None:
    """Your work here, with delivered.message_id, .body (bytes) and .headers; raising retries the message."""
    _log.info("processed", extra={"event": "processed", "message_id": delivered.message_id})


@cache
def _processor() -> Callable[[DeliveredMessage], None]:
    connection = os.environ.get("IDEMPOTENCY_CONNECTION", "")
    if not connection:
        return process
    log = TableProcessedLog.from_connection_string(connection, os.environ.get("IDEMPOTENCY_TABLE", "processed"))
    log.setup_infrastructure()
    return effectively_once(log)(process)


@app.queue_trigger(arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="DelayedDeliveryQueues")
def consume_orders(msg: func.QueueMessage) -> None:
    """One delivered message: a log line with its lateness, then its processing (once per id with the table)."""
    delivered = delivered_from_queue_message(msg)
    observe_lateness(delivered)
    _processor()(delivered)
