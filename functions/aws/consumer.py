"""Copy this: a Lambda that consumes what delayed delivery put on an SQS queue (``functions.aws.consumer.handler``).

Wire it to the destination queue with an SQS event source reporting batch item failures, as the CDK app's
``exampleConsumer`` option does. Powertools comes from its public layer; nothing is built before the first call.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from delayed_delivery.aws.receive import delivered_from_sqs_record, observe_lateness

__all__ = ["handler"]


@cache
def _tools() -> tuple[Logger, Metrics, BatchProcessor]:
    return Logger(), Metrics(), BatchProcessor(event_type=EventType.SQS)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Each record: read the delivered message, log and measure its lateness, then do the work (yours here)."""
    logger, metrics, processor = _tools()

    def consume(record: SQSRecord) -> None:
        delivered = delivered_from_sqs_record(record)
        observe_lateness(delivered, metrics=metrics, logger=logger)
        # Your work here, with delivered.message_id, delivered.body (bytes) and delivered.headers. Raising retries
        # this record alone (at least once: see docs/receiving.md for effectively-once processing).

    try:
        return dict(process_partial_response(event=event, record_handler=consume, processor=processor, context=context))
    finally:
        metrics.flush_metrics()
