"""Helpers for the timer tests: a timer on moto with compressed time, and a record of every SendMessageBatch."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer, TimerResult
from delayed_delivery.cancellations import CancellationCache
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, epoch_ms
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.format import BucketMessage

#: Aligned to the coarse size (10 s) of the compressed settings.
START = datetime(2031, 1, 1, tzinfo=UTC)
PREFIX = "dd/buckets"
#: The core settings of the timers: failures go to the error queue ``errors``.
SETTINGS = DelayedDeliverySettings(error_queue="errors")


@dataclass(frozen=True, slots=True)
class Sent:
    """One entry of a SendMessageBatch as the timer made it."""

    queue: str
    message_id: str | None
    body: str
    delay_seconds: int
    at: datetime
    attributes: dict[str, Any]

    @property
    def arrives(self) -> datetime:
        """When SQS makes it visible (at the earliest)."""
        return self.at + timedelta(seconds=self.delay_seconds)


@dataclass
class Recorder:
    """Every SendMessageBatch entry sent through ``sqs``, stamped with the manual time."""

    clock: ManualClock
    sent: list[Sent] = field(default_factory=list)

    def attach(self, sqs: Any) -> Recorder:
        sqs.meta.events.register("provide-client-params.sqs.SendMessageBatch", self._record)
        return self

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        queue = str(params["QueueUrl"]).rsplit("/", 1)[-1]
        for entry in params["Entries"]:
            attributes = dict(entry.get("MessageAttributes", {}))
            header = attributes.get(DELIVERY_HEADER, {}).get("StringValue")
            info = decode_delivery(header)
            self.sent.append(
                Sent(
                    queue,
                    info.message_id,
                    entry["MessageBody"],
                    entry.get("DelaySeconds", 0),
                    self.clock.now(),
                    attributes,
                )
            )

    def to(self, queue: str) -> list[Sent]:
        return [s for s in self.sent if s.queue == queue]


def make_store(s3: Any, bucket: str, tier: TierSettings, **bounds: int) -> S3BucketStore:
    return S3BucketStore(s3, bucket, PREFIX, tier.levels, **bounds)


def make_timer(
    store: S3BucketStore,
    sqs: Any,
    tier: TierSettings,
    clock: ManualClock,
    cache: CancellationCache | None = None,
    owner: str = "timer-1",
) -> BucketTimer:
    """A timer of ``store`` with the tier's send phase, sending failures to ``SETTINGS.error_queue``."""
    return BucketTimer(
        store,
        sqs,
        SETTINGS,
        clock,
        cancellations=cache,
        owner=owner,
        lease_seconds=5,
        tier=TierSettings().with_(bucket_send_phase_ms=tier.bucket_send_phase_ms),
    )


def message(
    n: int, due: datetime, *, destination: str = "orders", body: str | None = None, sent: datetime | None = None
) -> BucketMessage:
    attributes = {"kind": {"DataType": "String", "StringValue": f"k{n}"}}
    text = body if body is not None else f"body-{n}"
    return BucketMessage(
        f"m-{n}", destination, text.encode(), epoch_ms(due), attributes, sent_at_ms=epoch_ms(sent or START)
    )


def run_for(timer: BucketTimer, clock: ManualClock, seconds: int, step: float = 1.0) -> list[TimerResult]:
    """A timer run every ``step`` simulated seconds for ``seconds``."""
    results = []
    for _ in range(int(seconds / step)):
        clock.advance(step)
        results.append(timer.run())
    return results


def total(results: list[TimerResult], name: str) -> float:
    return sum(getattr(r, name) for r in results)


def queue_url(sqs: Any, name: str) -> str:
    return str(sqs.create_queue(QueueName=name)["QueueUrl"])


def settled(records: Any, endpoint: str, latest_due: datetime) -> bool:
    """Whether every record of ``endpoint`` left is an applied one settled: it ends within an hour of ``latest_due``
    (#31: applied records are kept that long, not deleted, so a copy sent before them arrives to be dropped too)."""
    from delayed_delivery.aws.tier.timer_work import SETTLE_SECONDS

    return all(r.expires_at <= latest_due + timedelta(seconds=SETTLE_SECONDS + 1) for r in records.live(endpoint))
