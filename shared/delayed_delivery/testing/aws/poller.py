"""A local stand-in for Lambda's SQS event source mapping, for tests and the demo.

It receives from a ``-delay.fifo`` queue (up to 10 records, all system and message attributes),
builds a real Lambda SQS event (the same record shape Lambda sends), invokes the handler and deletes
only the records the handler did not list in ``batchItemFailures``. When the handler raises, nothing
is deleted, as with Lambda: the records come back after the visibility timeout.
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

__all__ = ["LambdaHandler", "LocalEventSourcePoller", "LocalLambdaContext", "PollerStats", "lambda_sqs_record"]

#: ``handler(event, context) -> {"batchItemFailures": [...]}``
LambdaHandler = Callable[[dict[str, Any], Any], Mapping[str, Any] | None]


@dataclass(frozen=True, slots=True)
class LocalLambdaContext:
    """The parts of a Lambda context object that Powertools reads."""

    function_name: str = "delayed-delivery-requeue"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:delayed-delivery-requeue"
    memory_limit_in_mb: int = 256
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_group_name: str = "/aws/lambda/delayed-delivery-requeue"
    log_stream_name: str = "local"
    timeout_s: float = 30.0

    def get_remaining_time_in_millis(self) -> int:
        """A generous constant: the local poller never times a handler out."""
        return int(self.timeout_s * 1000)


@dataclass(slots=True)
class PollerStats:
    """What the poller did."""

    receives: int = 0
    empty_receives: int = 0
    records: int = 0
    deleted: int = 0
    failed: int = 0
    invocations: int = 0
    handler_errors: int = 0
    lost_deletes: int = 0
    #: Records received after ``stop()`` was asked for: not handed to the handler (they come back when their
    #: visibility timeout ends, as a disabled mapping leaves them).
    dropped_after_stop: int = 0
    poll_errors: int = 0


def lambda_sqs_record(message: MessageTypeDef, queue_arn: str, region: str) -> dict[str, Any]:
    """Turn a ReceiveMessage message into the record Lambda's SQS event source would deliver."""
    attributes: dict[str, Any] = {}
    for name, value in message.get("MessageAttributes", {}).items():
        converted: dict[str, Any] = {"stringListValues": [], "binaryListValues": [], "dataType": value["DataType"]}
        if "BinaryValue" in value:
            converted["binaryValue"] = base64.b64encode(bytes(value["BinaryValue"])).decode("ascii")
        else:
            converted["stringValue"] = value.get("StringValue", "")
        attributes[name] = converted
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes", {})),
        "messageAttributes": attributes,
        "md5OfMessageAttributes": message.get("MD5OfMessageAttributes"),
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }


class LocalEventSourcePoller:
    """Polls one queue and feeds the handler Lambda-shaped events (batch ≤ 10, partial batch responses)."""

    def __init__(
        self,
        client: SQSClient,
        queue_url: str,
        queue_arn: str,
        handler: LambdaHandler,
        *,
        batch_size: int = 10,
        wait_seconds: int = 1,
        lose_delete: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.client = client
        self.queue_url = queue_url
        self.queue_arn = queue_arn
        self.region = queue_arn.split(":")[3]
        self.handler = handler
        self.batch_size = batch_size
        self.wait_seconds = wait_seconds
        self.lose_delete = lose_delete
        self.stats = PollerStats()
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self, wait_seconds: int | None = None, *, until_stopped: bool = False) -> int:
        """Receive one batch and process it; returns the number of records.

        ``until_stopped`` (the background loop): a batch that arrives once ``stop()`` was asked for is left alone. A
        receive can outlast the stop's join (a slow emulator); its batch must not reach a handler whose test ended.
        """
        reply = self.client.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.batch_size,
            WaitTimeSeconds=self.wait_seconds if wait_seconds is None else wait_seconds,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        self.stats.receives += 1
        messages = reply.get("Messages", [])
        if not messages:
            self.stats.empty_receives += 1
            return 0
        if until_stopped and self._stop.is_set():
            self.stats.dropped_after_stop += len(messages)
            return 0
        records = [lambda_sqs_record(m, self.queue_arn, self.region) for m in messages]
        self.stats.records += len(records)
        self._invoke(records)
        return len(records)

    def _invoke(self, records: Sequence[dict[str, Any]]) -> None:
        event = {"Records": list(records)}
        self.events.append(event)
        self.stats.invocations += 1
        try:
            response = self.handler(event, LocalLambdaContext())
        except Exception:
            self.stats.handler_errors += 1
            return
        failed = {item["itemIdentifier"] for item in (response or {}).get("batchItemFailures", [])}
        self.stats.failed += len(failed)
        to_delete = []
        for record in records:
            if record["messageId"] in failed:
                continue
            if self.lose_delete is not None and self.lose_delete(record):
                self.stats.lost_deletes += 1
                continue
            to_delete.append(record)
        for start in range(0, len(to_delete), 10):
            chunk = to_delete[start : start + 10]
            self.client.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": r["receiptHandle"]} for i, r in enumerate(chunk)],
            )
            self.stats.deleted += len(chunk)

    def start(self) -> LocalEventSourcePoller:
        """Poll in a background thread until ``stop()``."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"poller-{self.queue_arn}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once(until_stopped=True)
            except Exception:  # the emulator being slow or gone must not kill the loop; it is counted
                self.stats.poll_errors += 1
                time.sleep(0.2)

    def signal_stop(self) -> None:
        """Ask the background thread to stop after its current poll (returns at once)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop the background thread (waits for the current poll)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_seconds + 30)
            self._thread = None
