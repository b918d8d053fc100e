"""The operator-route interface: one ``send`` / ``pending`` / ``cancel`` / ``reschedule`` for every route."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from delayed_delivery.app.emulators import azurite_connection_string
from delayed_delivery.clock import SystemClock, utc
from delayed_delivery.durations import to_seconds
from delayed_delivery.errors import DelayedDeliveryError

if TYPE_CHECKING:
    from delayed_delivery.aws.tier.relocate import ScanProgress

__all__ = [
    "LOCAL_AZURITE_PORTS",
    "LOCAL_MOTO_PORT",
    "LOCAL_MOTO_URL",
    "LOCAL_REGION",
    "BacklogPeriod",
    "CancelRequest",
    "CancelResult",
    "Capability",
    "CloudOptions",
    "NewDue",
    "OperatorRoute",
    "PendingReport",
    "QueueDepth",
    "RecordReceipt",
    "RescheduleRequest",
    "RescheduleResult",
    "SendResult",
    "SqsCounts",
    "UsageError",
    "azure_connection",
    "check_pending",
    "check_request",
    "local_azure_connection_string",
    "require_endpoint",
    "resolve_due",
]

LOCAL_MOTO_PORT = 5000
LOCAL_MOTO_URL = f"http://127.0.0.1:{LOCAL_MOTO_PORT}"
LOCAL_REGION = "us-east-1"
#: Azurite's standard ports: blob, queue, table.
LOCAL_AZURITE_PORTS = (10000, 10001, 10002)


class UsageError(DelayedDeliveryError):
    """A command-line mistake, e.g. an option the chosen route does not take."""


def local_azure_connection_string() -> str:
    """The connection string ``UseDevelopmentStorage=true`` stands for (Azurite on 10000-10002)."""
    return azurite_connection_string(*LOCAL_AZURITE_PORTS)


def azure_connection(connection: str | None, local: bool) -> str | None:
    """The connection string to use: ``UseDevelopmentStorage=true`` and ``--local`` mean Azurite on 10000-10002."""
    if connection and connection.strip().rstrip(";").lower() == "usedevelopmentstorage=true":
        return local_azure_connection_string()
    if local and not connection:
        return local_azure_connection_string()
    return connection


def require_endpoint(endpoint: str) -> str:
    """``--endpoint``: Azure keeps each endpoint's delayed messages in its own table, so it must be named."""
    if not endpoint.strip():
        raise UsageError(
            "on Azure give --endpoint NAME (env DELAYED_DELIVERY_ENDPOINT): the endpoint whose delays table holds the "
            "messages (`delayed-delivery azure names --endpoint NAME` shows the table)"
        )
    return endpoint.strip()


#: A reschedule's new due time: a moment (``--at``), or a delay (``--delay``) counted from the write itself.
NewDue = datetime | timedelta


def resolve_due(due: NewDue, now: datetime) -> datetime:
    """``due`` as a moment: a delay counts from ``now``, taken at the write (not before the command connected)."""
    return utc(now) + due if isinstance(due, timedelta) else due


def seconds_until(due: datetime, delay: str | None = None) -> float:
    """Seconds from now until ``due`` (0 when it is past); with ``delay`` (``send --delay``) the delay itself, counted
    from now, at the write: the time the command took to connect is not taken off it."""
    if delay is not None:
        return to_seconds(delay)
    return max(0.0, (utc(due) - SystemClock().now()).total_seconds())


@dataclass(frozen=True, slots=True)
class CloudOptions:
    """Connection options from flags or the environment."""

    cloud: str
    local: bool = False
    endpoint_url: str | None = None
    region: str | None = None
    connection_string: str | None = None
    endpoint: str = ""


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a sent message went: its id, the route it took, its due time, and the cloud's details."""

    message_id: str
    route: str
    destination: str
    due_at: datetime
    cloud: str | None = None
    #: aws: the queue it was sent to, the native delay and the planned hops.
    queue: str | None = None
    delay_seconds: int | None = None
    fifo_cycles: int | None = None
    #: azure: the delays table when it took the table route.
    table: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``send --json`` document."""
        d: dict[str, Any] = {"message_id": self.message_id}
        if self.cloud is not None:
            d["cloud"] = self.cloud
        d["route"] = self.route
        if self.cloud == "aws":
            d["queue"] = self.queue
        d["destination"] = self.destination
        if self.cloud == "aws":
            d.update(delay_seconds=self.delay_seconds, fifo_cycles=self.fifo_cycles)
        if self.cloud == "azure":
            d["table"] = self.table
        d["due_at"] = self.due_at.isoformat()
        return d


@dataclass(frozen=True, slots=True)
class BacklogPeriod:
    """Pending messages due in the period (an hour or a day, ``pending --by``) that starts at ``start``."""

    start: datetime
    count: int


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Approximate SQS counts of one endpoint, in SQS messages: on the hop cycle (envelopes count once), waiting a
    final native delay, ready at the destination."""

    queue: str
    hop_cycle: int
    final_native_delay: int
    ready_at_destination: int


#: What SQS cannot count: the messages inside envelopes (their number is known only to whoever receives them).
ENVELOPE_NOTE = (
    "SQS counts SQS messages: a packed envelope counts once and carries up to {most} delayed messages, and how many "
    "it carries is known only when it is received (and delayed or parked ones cannot be received before their "
    "time), so these are at least as many messages as SQS messages, not a count of them"
)


@dataclass(frozen=True, slots=True)
class SqsCounts:
    """What SQS queue attributes tell, approximate (eventually consistent) and in SQS messages, not messages."""

    #: SQS messages on the ``-delay.fifo`` hop cycles and waiting out their final ``DelaySeconds`` (the rows).
    delayed_sqs_messages: int
    #: The most delayed messages one envelope carries.
    envelope_max_messages: int
    #: The time-bucket tier's ingest queue (messages on their way into S3), when it exists.
    ingest_queue: str | None = None
    ingest_sqs_messages: int | None = None
    #: Ingest records that failed their receives and wait in the ingest queue's dead-letter queue.
    ingest_dlq_sqs_messages: int | None = None

    @property
    def sqs_messages(self) -> int:
        """Every SQS message still to be delivered: the hop cycles, final delays and the ingest backlog."""
        return self.delayed_sqs_messages + (self.ingest_sqs_messages or 0)

    @property
    def note(self) -> str:
        """What these counts are, and what they cannot say."""
        return ENVELOPE_NOTE.format(most=f"{self.envelope_max_messages:,}")

    def as_dict(self) -> dict[str, Any]:
        """The ``approximate`` object of ``pending --json``."""
        return {
            "sqs_messages": self.sqs_messages,
            "messages_at_least": self.sqs_messages,
            "hop_cycle_and_final_delay_sqs_messages": self.delayed_sqs_messages,
            "ingest_queue": self.ingest_queue,
            "ingest_sqs_messages": self.ingest_sqs_messages,
            "ingest_dlq_sqs_messages": self.ingest_dlq_sqs_messages,
            "envelope_max_messages": self.envelope_max_messages,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class PendingReport:
    """The backlog of a route: exact counts by due hour or day, and (SQS) approximate counts per queue, apart.

    ``pending`` is an exact count of messages, or ``None`` where the route has none (SQS without the tier);
    ``approximate`` holds what SQS queue attributes say, in SQS messages. The two are never added up.
    """

    pending: int | None
    route: str
    cloud: str | None = None
    #: None when the route knows no due times (SQS); then ``queues`` holds its counts.
    backlog: tuple[BacklogPeriod, ...] | None = None
    next_due: datetime | None = None
    oldest_overdue_seconds: float = 0.0
    queues: tuple[QueueDepth, ...] | None = None
    claimed_or_retrying: int | None = None
    #: Azure: of ``pending``, the messages already placed on their queues, hidden until due (cancellable).
    placed: int | None = None
    table: str | None = None
    error_queue: str | None = None
    error_queue_messages: int | None = None
    limits: str | None = None
    approximate: SqsCounts | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``pending --json`` document."""
        d: dict[str, Any] = {}
        if self.cloud is not None:
            d.update(cloud=self.cloud, route=self.route)
        if self.table is not None:
            d["table"] = self.table
        d["pending"] = self.pending
        if self.claimed_or_retrying is not None:
            d["claimed_or_retrying"] = self.claimed_or_retrying
        if self.placed is not None:
            d["placed"] = self.placed
        if self.backlog is not None:
            d["next_due"] = self.next_due.isoformat() if self.next_due else None
            d["oldest_overdue_seconds"] = self.oldest_overdue_seconds
            d["backlog"] = [{"bucket": b.start.isoformat(), "count": b.count} for b in self.backlog]
        if self.queues is not None:
            d["queues"] = [asdict(q) for q in self.queues]
        if self.approximate is not None:
            d["approximate"] = self.approximate.as_dict()
        if self.cloud is not None:
            d.update(error_queue=self.error_queue, error_queue_messages=self.error_queue_messages, limits=self.limits)
        return d


def backlog_report(periods: Mapping[datetime, int], earliest: datetime | None, **fields: Any) -> PendingReport:
    """An exact report from counts by due ``periods``, the ``earliest`` due time and ``PendingReport`` ``fields``."""
    now = SystemClock().now()
    overdue = (now - earliest).total_seconds() if earliest is not None and earliest <= now else 0.0
    return PendingReport(
        pending=fields.pop("pending", sum(periods.values())),
        backlog=tuple(BacklogPeriod(start, n) for start, n in sorted(periods.items())),
        next_due=earliest,
        oldest_overdue_seconds=overdue,
        **fields,
    )


@dataclass(frozen=True, slots=True)
class RecordReceipt:
    """A cancel or reschedule record on the SQS hop cycle, applied at the message's next hop."""

    queue: str
    table: str
    expires_at: datetime
    note: str


@dataclass(frozen=True, slots=True)
class CancelResult:
    """A cancel: done exactly (``cancelled``; False when nothing was pending), or requested by ``record``."""

    message_id: str
    route: str
    cancelled: bool
    record: RecordReceipt | None = None
    #: With a record: whether the message is certainly dropped (its due time was given and is far enough).
    certain: bool = True
    #: With a record: why the message may already be on its way (the record is written all the same).
    warning: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``cancel --json`` document."""
        if self.record is None:
            return {"message_id": self.message_id, "cancelled": self.cancelled, "route": self.route}
        r = self.record
        return {
            "message_id": self.message_id,
            "route": self.route,
            "queue": r.queue,
            "requested": "cancel",
            "certain": self.certain,
            "table": r.table,
            "record_expires_at": r.expires_at.isoformat(),
            "note": r.note,
        }


@dataclass(frozen=True, slots=True)
class RescheduleResult:
    """A reschedule: done exactly (``moved``; False when nothing was pending), or requested by ``record``."""

    message_id: str
    route: str
    due_at: datetime
    moved: bool
    record: RecordReceipt | None = None

    @property
    def missing(self) -> bool:
        """No such message is pending: nothing moved, and no record waits to move it later."""
        return not self.moved and self.record is None

    def as_dict(self) -> dict[str, Any]:
        """The ``reschedule --json`` document."""
        if self.record is None:
            return {"message_id": self.message_id, "due_at": self.due_at.isoformat(), "route": self.route}
        r = self.record
        return {
            "message_id": self.message_id,
            "route": self.route,
            "queue": r.queue,
            "requested": "reschedule",
            "due_at": self.due_at.isoformat(),
            "table": r.table,
            "record_expires_at": r.expires_at.isoformat(),
            "note": r.note,
        }


class Capability(StrEnum):
    """What a route does beyond exact cancel and reschedule by id; an operator option needs one of them."""

    #: Records kept per destination queue until the message's next hop (SQS): ``--to``, cancel's ``--due``,
    #: pending's ``--queue``.
    HOP_CYCLE = "hop-cycle"
    #: Finding the message in the time-bucket tier's objects: reschedule's ``--due``, ``--scan-limit``,
    #: ``--keep-record``.
    TIER_SEARCH = "tier-search"


#: What a command line that asks for a capability the route lacks is told.
_NEEDS = {
    Capability.HOP_CYCLE: "--to and --due are for --cloud aws (the SQS hop cycle)",
    Capability.TIER_SEARCH: "--due, --scan-limit and --keep-record need the time-bucket tier (--cloud aws "
    "--bucket-name)",
}


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """Cancel ``message_id``; on SQS ``to`` is its queue and ``due`` its due time, if known."""

    message_id: str
    to: str | None = None
    due: datetime | None = None

    def needs(self) -> tuple[Capability, ...]:
        """The capabilities the options given here need."""
        return (Capability.HOP_CYCLE,) if self.to is not None or self.due is not None else ()


@dataclass(frozen=True, slots=True)
class RescheduleRequest:
    """Move ``message_id`` to ``due`` (a delay counts from the write).

    ``to``: its queue (SQS); ``current_due``, ``scan_limit``, ``keep_record``: how the time-bucket tier finds it
    (by its current due time, or a scan of at most ``scan_limit`` objects), reporting ``progress``.
    """

    message_id: str
    due: NewDue
    to: str | None = None
    current_due: datetime | None = None
    scan_limit: int | None = None
    keep_record: bool = False
    progress: Callable[[ScanProgress], None] | None = field(default=None, compare=False)

    def needs(self) -> tuple[Capability, ...]:
        """The capabilities the options given here need (the tier's first, as the command line reads them)."""
        tier = self.current_due is not None or self.scan_limit is not None or self.keep_record
        return (*((Capability.TIER_SEARCH,) if tier else ()), *((Capability.HOP_CYCLE,) if self.to else ()))


class OperatorRoute(Protocol):
    """What the operator commands need of a route: a SQL store, the Azure delays table or SQS."""

    name: str
    #: What it supports beyond exact cancel and reschedule by id (``check_request`` refuses the rest).
    capabilities: ClassVar[frozenset[Capability]]

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
        """Send ``body`` to ``to``, due at ``due`` (``delay``: the text it came from, when given as a delay)."""
        ...

    def pending(self, bucket_seconds: int, *, queue: str | None = None) -> PendingReport:
        """The backlog in buckets of ``bucket_seconds`` (``queue``: SQS only, one endpoint)."""
        ...

    def cancel(self, request: CancelRequest) -> CancelResult:
        """Cancel the request's message (checked by ``check_request`` first)."""
        ...

    def reschedule(self, request: RescheduleRequest) -> RescheduleResult:
        """Move the request's message (checked by ``check_request`` first)."""
        ...


def check_request(route: OperatorRoute, request: CancelRequest | RescheduleRequest) -> None:
    """``UsageError`` for an option of ``request`` that ``route`` does not take: the one check the CLI makes."""
    for needed in request.needs():
        if needed not in route.capabilities:
            raise UsageError(_NEEDS[needed])


def check_pending(route: OperatorRoute, queue: str | None) -> None:
    """``UsageError`` for ``pending --queue`` on a route without per-queue records."""
    if queue is not None and Capability.HOP_CYCLE not in route.capabilities:
        raise UsageError("--queue is for --cloud aws")


def require_queue(to: str | None) -> str:
    """``--to``: required on SQS, where cancel and reschedule records are kept per destination queue."""
    if not to:
        raise UsageError("on --cloud aws give --to QUEUE: the destination queue the message was sent to")
    return to
