"""The SQS route (``--cloud aws``): send through the delayed sender; pending from queue attributes; cancel and
reschedule by a record on the hop cycle, applied at the message's next hop."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, ClassVar

from delayed_delivery.app.routes.aws_clients import cli_client
from delayed_delivery.app.routes.base import (
    LOCAL_MOTO_URL,
    CancelRequest,
    CancelResult,
    Capability,
    CloudOptions,
    PendingReport,
    QueueDepth,
    RecordReceipt,
    RescheduleRequest,
    RescheduleResult,
    SendResult,
    SqsCounts,
    UsageError,
    require_queue,
    resolve_due,
    seconds_until,
)
from delayed_delivery.cancellations import binding_note
from delayed_delivery.clock import SystemClock, utc
from delayed_delivery.errors import DestinationNotFoundError, InvalidMessageError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeNameType

    from delayed_delivery.aws.cancellations import DynamoDbCancellationStore

__all__ = ["SqsOperatorRoute"]


class SqsOperatorRoute:
    """Send through ``SqsDelayedSender``; pending from queue attributes; cancel / reschedule by record on the cycle."""

    name = "aws"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.HOP_CYCLE})

    def __init__(self, options: CloudOptions) -> None:
        from delayed_delivery.aws.settings import SqsSettings
        from delayed_delivery.settings import DelayedDeliverySettings

        endpoint_url = options.endpoint_url or (LOCAL_MOTO_URL if options.local else None)
        self.where = endpoint_url or "AWS"
        self.client: SQSClient = cli_client("sqs", endpoint_url, options.region, local=options.local)
        self.settings = DelayedDeliverySettings.from_env(os.environ)
        self.sqs_settings = SqsSettings.from_env(os.environ)
        # moto serves DynamoDB on the SQS port; AWS_ENDPOINT_URL_DYNAMODB splits them.
        table_endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or endpoint_url
        self.dynamodb: DynamoDBClient = cli_client("dynamodb", table_endpoint, options.region, local=options.local)

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
        """Send with the delayed sender: native ``DelaySeconds`` up to the cap, else the ``-delay.fifo`` hops."""
        from delayed_delivery.aws.sender import SqsDelayedSender

        if cancellable:
            raise UsageError(
                "--cancellable is for --cloud azure (on SQS, `cancel ID --to QUEUE` works for any long delay)"
            )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidMessageError(
                "an SQS body is text: the body is not UTF-8 (base64-encode binary data)"
            ) from None
        seconds = math.ceil(seconds_until(due, delay))
        receipt = SqsDelayedSender(self.client, self.settings, sqs_settings=self.sqs_settings).send_delayed(
            to, text, seconds, attributes=dict(headers), message_id=message_id
        )
        return SendResult(
            receipt.message_id,
            f"sqs-{receipt.route.value}",
            to,
            SystemClock().now() + timedelta(seconds=seconds),
            cloud="aws",
            queue=receipt.queue,
            delay_seconds=receipt.delay_seconds,
            fifo_cycles=receipt.fifo_cycles,
        )

    def pending(self, bucket_seconds: int, *, queue: str | None = None) -> PendingReport:
        """Approximate counts from queue attributes of every endpoint (``<q>`` with ``<q>-delay.fifo``) and of the
        tier's ingest queue, in SQS messages."""
        from botocore.exceptions import BotoCoreError, ClientError

        from delayed_delivery.aws.packing import MAX_ENVELOPE_ENTRIES
        from delayed_delivery.aws.sqs import translate_error

        try:
            if queue is not None:
                names = [queue.removesuffix("-delay.fifo")]
                urls = {}
                for name in (*names, f"{names[0]}-delay.fifo"):
                    urls[name] = self.client.get_queue_url(QueueName=name)["QueueUrl"]
            else:
                listed = self.client.list_queues(MaxResults=1000).get("QueueUrls", [])
                urls = {u.rsplit("/", 1)[-1]: u for u in listed}
                names = sorted(n.removesuffix("-delay.fifo") for n in urls if n.endswith("-delay.fifo"))
            wanted: list[QueueAttributeNameType] = [
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesDelayed",
                "ApproximateNumberOfMessagesNotVisible",
            ]
            rows: list[QueueDepth] = []
            for name in names:
                delay_name = f"{name}-delay.fifo"
                fifo = self.client.get_queue_attributes(QueueUrl=urls[delay_name], AttributeNames=wanted)["Attributes"]
                dest = (
                    self.client.get_queue_attributes(QueueUrl=urls[name], AttributeNames=wanted)["Attributes"]
                    if name in urls
                    else {}
                )
                rows.append(
                    QueueDepth(
                        name,
                        hop_cycle=sum(int(fifo.get(k, 0)) for k in wanted),
                        final_native_delay=int(dest.get("ApproximateNumberOfMessagesDelayed", 0)),
                        ready_at_destination=int(dest.get("ApproximateNumberOfMessages", 0)),
                    )
                )
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, f"reading queue attributes at {self.where}") from exc
        counts = SqsCounts(sum(r.hop_cycle + r.final_native_delay for r in rows), MAX_ENVELOPE_ENTRIES)
        counts = self._with_ingest(counts)
        return PendingReport(
            pending=None,
            route="sqs-queue-attributes",
            cloud="aws",
            queues=tuple(rows),
            error_queue=self.settings.error_queue,
            error_queue_messages=self._error_queue_depth(),
            limits=(
                "SQS counts are approximate (eventually consistent), count SQS messages and carry no due times: no "
                "backlog by hour/day, no next due or overdue. 'hop cycle' = SQS messages in <queue>-delay.fifo "
                "(delays beyond the native cap; an envelope counts once); 'final native delay' = messages waiting out "
                "DelaySeconds on the destination (they may also be directly sent short delays); 'ingest' = SQS "
                f"messages on their way into the time-bucket tier. {counts.note}."
            ),
            approximate=counts,
        )

    def _with_ingest(self, counts: SqsCounts) -> SqsCounts:
        """``counts`` with the tier's ingest queue and its dead-letter queue, when the ingest queue exists."""
        from dataclasses import replace

        from delayed_delivery.aws.tier.provision import dlq_name

        name = self.sqs_settings.bucket_ingest_queue
        backlog = self._depth(name)
        if backlog is None:
            return counts
        return replace(
            counts, ingest_queue=name, ingest_sqs_messages=backlog, ingest_dlq_sqs_messages=self._depth(dlq_name(name))
        )

    def _depth(self, name: str) -> int | None:
        """Visible, in-flight and delayed SQS messages of queue ``name`` (None when it does not exist)."""
        from botocore.exceptions import BotoCoreError, ClientError

        wanted: list[QueueAttributeNameType] = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesDelayed",
            "ApproximateNumberOfMessagesNotVisible",
        ]
        try:
            url = self.client.get_queue_url(QueueName=name)["QueueUrl"]
            attributes = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=wanted)["Attributes"]
        except (ClientError, BotoCoreError):
            return None
        return sum(int(attributes.get(k, 0)) for k in wanted)

    def _error_queue_depth(self) -> int | None:
        """Messages waiting in the error queue (None when it does not exist)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            url = self.client.get_queue_url(QueueName=self.settings.error_queue)["QueueUrl"]
            attrs = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        except (ClientError, BotoCoreError):
            return None
        return int(attrs["Attributes"].get("ApproximateNumberOfMessages", 0))

    def _records(self, to: str) -> DynamoDbCancellationStore:
        """The cancellation table, after checking that ``to`` has a hop cycle and the table exists."""
        from botocore.exceptions import BotoCoreError, ClientError

        from delayed_delivery.aws.cancellations import DEFAULT_TABLE, TABLE_ENV, DynamoDbCancellationStore
        from delayed_delivery.aws.sqs import translate_error
        from delayed_delivery.naming import sqs_delay_queue_name

        delay_queue = sqs_delay_queue_name(to)
        try:
            self.client.get_queue_url(QueueName=delay_queue)
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, f"looking up {delay_queue!r} at {self.where}")
            if isinstance(error, DestinationNotFoundError):
                raise DestinationNotFoundError(
                    f"unknown queue {to!r}: it has no {delay_queue!r} at {self.where}, so no message of it is on the "
                    "hop cycle (check --to)"
                ) from exc
            raise error from exc
        store = DynamoDbCancellationStore(self.dynamodb, os.environ.get(TABLE_ENV, "").strip() or DEFAULT_TABLE)
        store.check()
        return store

    def _reach(self) -> tuple[float, str]:
        """Seconds before its due time a message leaves the cycle (cap + record cache), and how to say it."""
        from delayed_delivery.aws.cancellations import cache_seconds_from_env
        from delayed_delivery.durations import format_duration

        cache = cache_seconds_from_env(os.environ)
        reach = self.sqs_settings.max_native_delay + cache
        return cache, (
            f"{format_duration(reach)} ({format_duration(self.sqs_settings.max_native_delay)} native cap + "
            f"{format_duration(cache)} record cache)"
        )

    def cancel(self, request: CancelRequest) -> CancelResult:
        """Write a cancel record for ``message_id`` on ``to``'s hop cycle; refused when ``due`` is too near."""
        from delayed_delivery.cancellations import cancel_request

        to, due = require_queue(request.to), request.due
        store = self._records(to)
        cache, reach = self._reach()
        record = cancel_request(
            to,
            request.message_id,
            now=SystemClock().now(),
            max_native_delay=self.sqs_settings.max_native_delay,
            max_age=cache,
            due=due,
        )
        store.put(record)
        if due is not None:
            note = f"it is dropped at its next hop, well before its due time {utc(due).isoformat()}"
        else:
            note = (
                f"it is dropped at its next hop unless it is due within {reach}: then it already waits out its "
                f"final native delay on {to!r} and is delivered (give --due to know for sure)"
            )
        receipt = RecordReceipt(to, store.table, record.expires_at, note + binding_note(record.requested_at))
        return CancelResult(request.message_id, "aws", cancelled=False, record=receipt, certain=due is not None)

    def reschedule(self, request: RescheduleRequest) -> RescheduleResult:
        """Write a reschedule record: ``message_id`` moves to ``due`` at its next hop on ``to``'s cycle."""
        from delayed_delivery.cancellations import reschedule_request
        from delayed_delivery.durations import format_duration

        to = require_queue(request.to)
        store = self._records(to)
        _, reach = self._reach()
        now = SystemClock().now()  # after connecting: a delay counts from the write
        record = reschedule_request(to, request.message_id, resolve_due(request.due, now), now=now)
        store.put(record)
        note = (
            f"it moves at its next hop (every {format_duration(self.sqs_settings.fifo_queue_delay)}), unless it is "
            f"already due within {reach}; a new due time sooner than that hop is met at the hop"
        )
        receipt = RecordReceipt(to, store.table, record.expires_at, note + binding_note(record.requested_at))
        assert record.due_at is not None
        return RescheduleResult(request.message_id, "aws", record.due_at, moved=False, record=receipt)
