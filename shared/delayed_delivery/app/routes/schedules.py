"""Schedule routes: where ``delayed-delivery schedule create|list|describe|pause|resume|backfill|delete`` act.

Self-contained beside the operator routes (``OperatorRoute`` is not widened). A route gives the schedule store, how
materialized occurrences are cancelled (pause, delete) and written (backfill), what the route refuses in a
template, and what it can say about occurrences already materialized:

* ``--store sqlite:///…|postgresql://…``: the ``delayed_schedules`` table beside the delayed messages; occurrences
  are rows of the message store (``pending`` counts them, ``cancel <id>`` removes one), written by the materializer
  inside the dispatcher's loop.
* ``--cloud aws``: the DynamoDB schedules table (``DELAYED_DELIVERY_SCHEDULE_TABLE``, default
  ``delayed-delivery-schedules``) read by the schedule timer; occurrences go straight to their queue with
  ``DelaySeconds`` up to the timer's lead ahead, where SQS cannot withdraw them.
* ``--cloud azure``: the endpoint's schedules table (``DELAYED_DELIVERY_SCHEDULE_TABLE_NAME``, default the delays
  table's name plus ``sched``) read by the function app's schedule timer; occurrences are rows of the endpoint's delays
  table (``pending`` counts them, ``cancel <id>`` removes one), written up to the timer's lead ahead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlparse

from delayed_delivery.app.routes.aws_clients import cli_client
from delayed_delivery.app.routes.base import LOCAL_MOTO_URL, CloudOptions, UsageError
from delayed_delivery.clock import SystemClock
from delayed_delivery.errors import ConfigurationError, MessageInFlightError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.redact import redact
from delayed_delivery.schedules.model import Schedule
from delayed_delivery.schedules.occurrences import expand
from delayed_delivery.schedules.ports import MessageCanceller, MessageWriter, ScheduleStore

if TYPE_CHECKING:
    from delayed_delivery.aws.schedules.sends import OccurrenceSender
    from delayed_delivery.azure.table_store import TableDelayedMessageStore
    from delayed_delivery.ports import DelayedMessageStore

__all__ = [
    "AwsScheduleRoute",
    "AzureScheduleRoute",
    "Materialized",
    "ScheduleRoute",
    "StoreScheduleRoute",
    "open_schedule_route",
]

#: Seconds a PostgreSQL connection of a command may take.
_CONNECT_TIMEOUT = 3.0
#: The most materialized occurrences ``describe`` looks up.
_SHOWN = 50


@dataclass(frozen=True, slots=True)
class Materialized:
    """An occurrence already written as a message (not yet due): its id, fire time, and where it waits."""

    occurrence_id: str
    fire_at: datetime
    where: str


class ScheduleRoute(Protocol):
    """What the schedule commands need of a route."""

    name: str
    #: Where the schedules are, for messages (``--store`` URL redacted, the table).
    where: str

    @property
    def store(self) -> ScheduleStore:
        """The schedule store (opened on first use)."""
        ...

    def canceller(self) -> MessageCanceller:
        """How pause and delete cancel materialized occurrences by id."""
        ...

    def backfill_writer(self) -> BackfillWriter:
        """Where backfill writes occurrences (``flush`` sends what it holds)."""
        ...

    def check(self, schedule: Schedule) -> None:
        """Refuse, in one line, a schedule this route cannot deliver."""
        ...

    def materialized(self, schedule: Schedule, now: datetime) -> list[Materialized]:
        """The schedule's occurrences written and not yet due (at most ``_SHOWN``)."""
        ...


class BackfillWriter(MessageWriter, Protocol):
    """A ``MessageWriter`` that may hold what it is given until ``flush``."""

    def flush(self) -> list[str]:
        """Send what is held; the ids not taken (to report)."""
        ...


class _StoreWriter:
    """Backfill into a message store: each occurrence stored at once."""

    def __init__(self, store: DelayedMessageStore) -> None:
        self.target = store

    def store(self, message: DelayedMessage) -> None:
        self.target.store(message)

    def flush(self) -> list[str]:
        return []


class StoreScheduleRoute:
    """Schedules in the SQL store a ``--store`` URL names, beside its delayed messages."""

    name = "store"

    def __init__(self, url: str | None) -> None:
        if not url:
            raise UsageError(
                "give a route: --store URL (SQL), --cloud aws or --cloud azure (add --local for the emulators)"
            )
        self.url = url
        self.where = redact(url)
        self._schedules: ScheduleStore | None = None
        self._messages: DelayedMessageStore | None = None

    @property
    def store(self) -> ScheduleStore:
        """The schedules table (created if missing)."""
        if self._schedules is None:
            self._schedules = _open_schedules(self.url)
        return self._schedules

    @property
    def messages(self) -> DelayedMessageStore:
        """The delayed-message store the occurrences are rows of."""
        if self._messages is None:
            from delayed_delivery.app.stores import open_store

            self._messages = open_store(self.url, connect_timeout=_CONNECT_TIMEOUT)
        return self._messages

    def canceller(self) -> MessageCanceller:
        """The message store's exact cancel."""
        return _Cancel(self.messages)

    def backfill_writer(self) -> BackfillWriter:
        """Occurrences stored as rows (the dispatcher releases them, paced by the release caps)."""
        return _StoreWriter(self.messages)

    def check(self, schedule: Schedule) -> None:
        """Every template a store can hold is deliverable here."""

    def materialized(self, schedule: Schedule, now: datetime) -> list[Materialized]:
        """The rows of the schedule's occurrences after now, up to its cursor."""
        return _pending_rows(self.messages, schedule, now, "pending in the store")


class _Cancel:
    """A message store's exact cancel (by id, no claim: refused while a dispatcher sends it)."""

    def __init__(self, messages: DelayedMessageStore) -> None:
        self.messages = messages

    def remove(self, message_id: str) -> bool:
        return self.messages.remove(message_id)


def _pending_rows(messages: DelayedMessageStore, schedule: Schedule, now: datetime, where: str) -> list[Materialized]:
    """The rows of ``messages`` holding the schedule's occurrences after now, up to its cursor (at most ``_SHOWN``)."""
    if schedule.cursor is None or schedule.cursor <= now:
        return []
    found = []
    for o in expand(schedule.definition.recurrence(), now + timedelta(microseconds=1),
                    schedule.cursor + timedelta(microseconds=1), schedule_id=schedule.schedule_id):  # fmt: skip
        assert o.id is not None
        row = messages.get(o.id) if hasattr(messages, "get") else None
        if row is not None:
            found.append(Materialized(o.id, row.due_at, where))
        if len(found) >= _SHOWN:
            break
    return found


def _open_schedules(url: str) -> ScheduleStore:
    """The schedule store of a store URL, its table created if missing."""
    scheme = urlparse(url).scheme
    if scheme == "sqlite" and url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        from delayed_delivery.schedules.sqlite_store import SqliteScheduleStore

        sqlite = SqliteScheduleStore(url[len("sqlite:///") :])
        sqlite.setup_infrastructure()
        return sqlite
    if scheme in ("postgres", "postgresql"):
        try:
            from delayed_delivery.postgres.schedules import PostgresScheduleStore
        except ImportError as exc:
            raise ConfigurationError(
                "PostgreSQL support needs the postgres extra: pip install 'delayed-delivery[postgres]'"
            ) from exc
        postgres = PostgresScheduleStore(url, connect_timeout=_CONNECT_TIMEOUT)
        postgres.setup_infrastructure()
        return postgres
    raise ConfigurationError(
        f"unknown store URL {redact(url)!r}: use sqlite:///file.db (relative), sqlite:////abs/file.db or postgresql://…"
    )


class _SqsCannotWithdraw:
    """SQS cannot take back a message sent with ``DelaySeconds``: a materialized occurrence is delivered."""

    def remove(self, message_id: str) -> bool:
        raise MessageInFlightError(f"{message_id} waits on its queue with its DelaySeconds: SQS cannot withdraw it")


class AwsScheduleRoute:
    """The DynamoDB schedules table and the SQS queues the schedule timer sends to."""

    name = "aws"

    def __init__(self, options: CloudOptions) -> None:
        from delayed_delivery.aws.schedules.layout import DEFAULT_TABLE
        from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
        from delayed_delivery.aws.schedules.table import SCHEDULE_TABLE_ENV
        from delayed_delivery.settings import DelayedDeliverySettings

        endpoint_url = options.endpoint_url or (LOCAL_MOTO_URL if options.local else None)
        # moto serves DynamoDB on the SQS port; AWS_ENDPOINT_URL_DYNAMODB splits them.
        table_endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or endpoint_url
        self.table = os.environ.get(SCHEDULE_TABLE_ENV, "").strip() or DEFAULT_TABLE
        self.where = f"DynamoDB table {self.table!r}"
        dynamodb = cli_client("dynamodb", table_endpoint, options.region, local=options.local)
        self._store = DynamoDbScheduleStore(dynamodb, self.table)
        self._sqs = cli_client("sqs", endpoint_url, options.region, local=options.local)
        self.settings = DelayedDeliverySettings.from_env(os.environ)

    @property
    def store(self) -> ScheduleStore:
        """The schedules table."""
        return self._store

    def canceller(self) -> MessageCanceller:
        """None can be withdrawn: pause reports them as on their way."""
        return _SqsCannotWithdraw()

    def backfill_writer(self) -> BackfillWriter:
        """Occurrences sent with the timer's sender (release caps apply), in batches."""
        return _SqsBackfill(self)

    def check(self, schedule: Schedule) -> None:
        """What SQS refuses: a FIFO destination, a body that is not SQS text, too many headers."""
        from delayed_delivery.aws.schedules.sends import check_sqs_template

        check_sqs_template(schedule)

    def materialized(self, schedule: Schedule, now: datetime) -> list[Materialized]:
        """The occurrences after now up to the cursor: sent, waiting on their queue (SQS lists no ids)."""
        if schedule.cursor is None or schedule.cursor <= now:
            return []
        found = []
        for o in expand(schedule.definition.recurrence(), now + timedelta(microseconds=1),
                        schedule.cursor + timedelta(microseconds=1), schedule_id=schedule.schedule_id,
                        max_jitter=schedule.definition.jitter_seconds):  # fmt: skip
            assert o.id is not None
            found.append(Materialized(o.id, o.fire_at, f"on {schedule.template.destination!r} with its delay"))
            if len(found) >= _SHOWN:
                break
        return found

    def sender(self) -> OccurrenceSender:
        """The timer's sender, with the release calendar when caps are set."""
        from delayed_delivery.aws.schedules.sends import OccurrenceSender

        release = None
        if self.settings.release_rates:
            from delayed_delivery.aws.config import RELEASE_TABLE_ENV
            from delayed_delivery.aws.release_calendar import ReleaseCalendar

            table = os.environ.get(RELEASE_TABLE_ENV, "").strip()
            if not table:
                raise ConfigurationError(
                    f"release_rates caps destinations: set {RELEASE_TABLE_ENV} (backfills take slots like the timer)"
                )
            release = ReleaseCalendar(self._store.client, table, self.settings.release_rates)
        return OccurrenceSender(self._sqs, self.settings.error_queue, SystemClock(), release=release)


class _SqsBackfill:
    """Backfill on SQS: occurrences held, then sent with the timer's sender; those not taken are retried a while."""

    def __init__(self, route: AwsScheduleRoute) -> None:
        self.route = route
        self.held: list[DelayedMessage] = []

    def store(self, message: DelayedMessage) -> None:
        self.held.append(message)

    def flush(self) -> list[str]:
        from delayed_delivery.aws.schedules.sends import Fate, Outgoing
        from delayed_delivery.schedules.occurrences import Occurrence, parse_occurrence_id

        if not self.held:
            return []
        sender = self.route.sender()
        store = self.route.store
        left = list(self.held)
        schedules: dict[str, Schedule | None] = {}  # read once (a backfill is one schedule's)
        for attempt in range(5):
            outgoing = []
            for m in left:
                sid, nominal = parse_occurrence_id(m.message_id)
                if sid not in schedules:
                    schedules[sid] = store.get(sid)
                schedule = schedules[sid]
                if schedule is None:
                    continue
                occurrence = Occurrence(m.message_id, nominal, m.due_at, nominal)
                outgoing.append(Outgoing(occurrence, schedule))
            outcome = sender.send(outgoing)
            left = [m for m in left if outcome.fates.get(m.message_id) is Fate.RETRY]
            if not left:
                return []
            SystemClock().sleep(min(5.0, 0.5 * 2**attempt))
        return [m.message_id for m in left]


class AzureScheduleRoute:
    """The endpoint's schedules table and its delays table, where the schedule timer writes the occurrences."""

    name = "azure"

    def __init__(self, options: CloudOptions) -> None:
        from delayed_delivery.app.routes.azure import AzureTableRoute
        from delayed_delivery.azure.schedules.config import AzureScheduleConfig
        from delayed_delivery.azure.schedules.store import TableScheduleStore

        self.delays = AzureTableRoute(options)
        self.table = AzureScheduleConfig.from_env(os.environ, self.delays.config.table_name).table_name
        self.where = f"Azure table {self.table!r} of endpoint {self.delays.endpoint!r}"
        self._store = TableScheduleStore(self.delays.clients.tables.get_table_client(self.table))
        self._ready = False

    @property
    def store(self) -> ScheduleStore:
        """The schedules table (created if missing; a 403: provisioned by the Bicep)."""
        if not self._ready:
            self._store.setup_infrastructure()
            self._ready = True
        return self._store

    @property
    def messages(self) -> TableDelayedMessageStore:
        """The endpoint's delays table (with the shard count it records)."""
        return self.delays.store

    def canceller(self) -> MessageCanceller:
        """The delays table's exact cancel."""
        return _Cancel(self.messages)

    def backfill_writer(self) -> BackfillWriter:
        """Occurrences stored as rows of the delays table (the dispatcher sends them, paced by the release caps)."""
        return _StoreWriter(self.messages)

    def check(self, schedule: Schedule) -> None:
        """What a storage queue refuses: a name that is not a queue's, an envelope over 64 KiB."""
        from delayed_delivery.azure.storage_queue import encode_envelope
        from delayed_delivery.naming import validate_azure_queue_name
        from delayed_delivery.schedules.materializer import occurrence_message
        from delayed_delivery.schedules.occurrences import Occurrence, utc_text

        validate_azure_queue_name(schedule.template.destination)
        at = schedule.definition.start
        encode_envelope(occurrence_message(schedule, Occurrence(f"{schedule.schedule_id}@{utc_text(at)}", at, at, at)))

    def materialized(self, schedule: Schedule, now: datetime) -> list[Materialized]:
        """The delays table's rows of the schedule's occurrences after now, up to its cursor."""
        return _pending_rows(
            self.messages, schedule, now, f"pending in the delays table {self.messages.table.table_name}"
        )


def open_schedule_route(cloud: CloudOptions | None, store: str | None) -> ScheduleRoute:
    """The schedule route of ``--cloud`` (it wins) or ``--store``."""
    if cloud is None:
        return StoreScheduleRoute(store)
    if cloud.cloud == "aws":
        try:
            return AwsScheduleRoute(cloud)
        except ImportError as exc:
            from delayed_delivery.errors import extra_missing

            raise extra_missing("the aws route", "cli", "aws") from exc
    if cloud.cloud == "azure":
        try:
            return AzureScheduleRoute(cloud)
        except ImportError as exc:
            from delayed_delivery.errors import extra_missing

            raise extra_missing("the azure route", "cli", "azure") from exc
    raise UsageError(f"--cloud {cloud.cloud!r}: use aws or azure")
