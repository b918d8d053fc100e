"""SQS as a migration target (``sqs:REGION``): each message goes through the AWS adapter's sender."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ..errors import ConfigurationError
from ..headers import HEADER_PREFIX
from ..model import DelayedMessage

__all__ = ["SqsTarget"]


class SqsTarget:
    """SQS through the AWS adapter's ``SqsDelayedSender``: native ``DelaySeconds`` up to 900 s, ``-delay.fifo`` beyond.

    The body must be UTF-8 text and the headers become message attributes (at most 10, or 9 on the FIFO
    route); the migration's own ``DelayedDelivery.*`` marker headers are not sent (SQS reserves that
    prefix for the product). A message SQS cannot take is refused, not fatal. SQS cannot take back a
    sent message, so ``abort`` cannot undo this target.

    Reruns: standard queues do not deduplicate, so the job checkpoints every acknowledged send of 10
    (``checkpoint_rows``) and a killed run, resumed, resends at most the 10 messages in flight when it
    died (per executor task). The ``-delay.fifo`` route deduplicates on ``<id>:0`` within SQS's
    5-minute window: a resume inside it sends those 10 again without duplicates.
    """

    can_undo = False
    #: One SendMessageBatch: the ledger records every acknowledged batch of 10, so a killed run resends at most 10.
    checkpoint_rows = 10
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

    def flush(self) -> None:
        """Nothing buffered: every ``write`` is acknowledged when it returns."""

    def undo(self, message_ids: Sequence[str]) -> int:
        """SQS cannot take back a sent message."""
        raise ConfigurationError(self.undo_note)

    def close(self) -> None:
        """Nothing to release."""
