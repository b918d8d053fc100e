"""Copy this: a Lambda that consumes what delayed delivery put on an SQS queue (``functions.aws.consumer.handler``).

Wire it to the destination queue with an SQS event source reporting batch item failures, as the CDK app's
``exampleConsumer`` option does. With ``IDEMPOTENCY_TABLE`` set (a DynamoDB table, partition key ``id``, TTL on
``expiration``) each message id is processed once, duplicates included. Nothing is built before the first call.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from delayed_delivery.aws.idempotency import DynamoDBEffectivelyOnce
from delayed_delivery.aws.receive import delivered_from_sqs_record, observe_lateness
from delayed_delivery.delivery import DeliveredMessage

__all__ = ["handler", "process"]


@cache
def _tools() -> tuple[Logger, Metrics, BatchProcessor, DynamoDBEffectivelyOnce | None]:
    table = os.environ.get("IDEMPOTENCY_TABLE", "")
    once = DynamoDBEffectivelyOnce(table, name="example-consumer") if table else None
    return Logger(), Metrics(), BatchProcessor(event_type=EventType.SQS), once


def process(delivered: DeliveredMessage, logger: Logger) -> None:
    """Your work here, with delivered.message_id, .body (bytes) and .headers; raising retries this record alone."""
    logger.info("processed", extra={"event": "processed", "message_id": delivered.message_id})


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Each record: read the delivered message, log and measure its lateness, then process it (once per id)."""
    logger, metrics, processor, once = _tools()

    def consume(record: SQSRecord) -> None:
        delivered = delivered_from_sqs_record(record)
        observe_lateness(delivered, metrics=metrics, logger=logger)
        if once is None:
            process(delivered, logger)
        else:
            once.run(delivered, lambda: process(delivered, logger))

    try:
        return dict(process_partial_response(event=event, record_handler=consume, processor=processor, context=context))
    finally:
        metrics.flush_metrics()
