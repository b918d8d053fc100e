"""Crash injection for the Azure route (placer and dispatcher over the delays table, blob leases, Storage Queues) on
Azurite, the way ``bucketlab.py`` does it for the S3 tier: in-process crash points, a manual clock, fresh objects for
the restart, a fault-injecting HTTP transport.

Each shard has a "life": its own service clients, its exclusive view of the table, a core ``Dispatcher`` over it
(``overlap_removal``, as ``AzureDispatcherHost`` wires it), a ``Placer`` and the shard's ``BlobLease``. Each tick the
lab stores a round of messages (some due within two seconds, some within the lead, some beyond it; one round in
``BURST_EVERY`` a burst due in one second, bigger than a batch), and for every shard renews its lease, runs one
placement pass (sweep, then batches) and one dispatch pass (``dispatch_due`` until nothing is due, its ``keep_going``
the lease, renewed every ``RENEW_CALLS`` asks as the renewal thread would), moves the manual clock a second and drains
the destination queues. An operator (its own clients, never faulted) cancels and reschedules random pending messages.

Every HTTP request of a life goes through ``LabHttp`` (the innermost transport, under the SDK's retry policies), which
names its step from the request itself: the table's query, entity read, claim, record, give-back, delete and
failure-count transactions (``$batch``) or single-entity writes, the queue's put, delete and update, the lease's
acquire, renew and release. Its role is the pass the lab is in (``placer`` or ``dispatcher``; ``lease`` for lease
requests). ``POINTS``: a crash before or after each request of each (role, step) the code has (``STEPS``); the crash
is a ``BaseException`` nothing catches and every later request of that life dies too, so no ``finally`` gives
anything back; the lab breaks the dead holder's lease (as its expiry would), moves the clock past the claims and
builds a new life. ``TRANSPORT_FAULTS``: one request of a (role, step) fails with a connection reset before it was
sent, a reset or a read timeout after the service took it (its answer lost), or a 503 the service sent instead of
doing it. ``EPISODES``: the holder's lease broken mid-burst while a second holder takes the shard and runs (the old
one notices at its next renewal), and an operator's cancel or reschedule of the message a placer or dispatcher has
just put, before its record. One fault is armed at a time, in a seeded shuffled cycle; one not reached within
``QUIET_TICKS`` ticks is counted as unreached and the next is armed.

Checked from what reaches the queues (drained with receive and delete; each copy is tied to the put that made it by
its queue message id): lost (stored, not cancelled with certainty, never arrived), certain cancels delivered, copies
visible before their due time (the visibility of each put or update against the lab's clock) or still arriving after
a reschedule answered done, the error queue. Each duplicate is explained by the copy before it: its put's answer was
lost (a fault after the request), or its life crashed after the put; else it is ``unexplained`` (a bug).

Operators use the lab's clock (``table_store`` and ``placed_ops`` read ``datetime.now``; patched to it), so their
in-flight and visible-by-now decisions see the time the dispatchers see. Azurite's visibility timeouts run on real
time, so the drain may receive a placed message before the lab's clock reaches its due time; "early" is judged from
the visibility each put asked for, not from when the drain saw it.

Soak: ``python -m tests.reliability.azurecrashlab --faults 1000`` (starts its own Azurite; prints a table, writes
``benchmarks/results/azurecrashlab.json`` as it goes, ``"complete": false`` until the end).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlparse

import requests
from azure.core.exceptions import AzureError, ResourceNotFoundError, ServiceRequestError, ServiceResponseError
from azure.core.pipeline.transport import HttpTransport, RequestsTransportResponse
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobLeaseClient, BlobServiceClient
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure import placed_ops, rows, table_store
from delayed_delivery.azure.blob_lease import BlobLease, lease_blob_name
from delayed_delivery.azure.config import AzureClients, AzureDelayedDeliveryConfig, _client_options
from delayed_delivery.azure.destinations import GuardedTransport
from delayed_delivery.azure.placement import PlacementReport, Placer
from delayed_delivery.azure.run_budget import RunBudget
from delayed_delivery.azure.storage_queue import BudgetedRetry, StorageQueueTransport, decode_envelope
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.clock import ManualClock
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.errors import DelayedDeliveryError, MessageInFlightError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from tests.reliability.crashlab import InjectedCrash

SHARDS = 2
QUEUES = ("labq0", "labq1")
#: Seconds ahead rows are placed on their queues (compressed from Bicep's two hours).
LEAD = 20.0
CLAIM = 20.0
LEASE = 15
BATCH = 50
CONCURRENCY = 4
#: The lease is renewed every this many ``keep_going`` asks (the renewal thread's pace, made deterministic).
RENEW_CALLS = 15
BURST = 60
BURST_EVERY = 4
ROUND = 3
#: Rows a placement batch takes (a burst takes two).
PLACE_BATCH = 40
QUIET_TICKS = 8
#: A target not reached this many times is left out of later cycles (reported as unreached).
GIVE_UP = 2

PLACER_STEPS = (
    "query",
    "claim",
    "claim_one",
    "put",
    "record",
    "give_back",
    "delete",
    "delete_one",
    "get",
    "queue_delete",
)
DISPATCHER_STEPS = ("query", "claim", "claim_one", "put", "delete", "give_back", "count_failure", "get", "delete_one")
LEASE_STEPS = ("acquire", "renew")
STEPS = (
    *(("placer", s) for s in PLACER_STEPS),
    *(("dispatcher", s) for s in DISPATCHER_STEPS),
    *(("lease", s) for s in LEASE_STEPS),
)
POINTS = tuple(f"crash_{when}:{role}.{step}" for role, step in STEPS for when in ("before", "after"))
FAULT_KINDS = ("reset_before", "reset_after", "timeout_after", "throttled_503")
FAULT_STEPS = (
    ("placer", "put"),
    ("placer", "claim"),
    ("placer", "record"),
    ("placer", "give_back"),
    ("placer", "delete"),
    ("dispatcher", "put"),
    ("dispatcher", "claim"),
    ("dispatcher", "delete"),
    ("dispatcher", "give_back"),
    ("lease", "renew"),
)
TRANSPORT_FAULTS = tuple(f"{kind}:{role}.{step}" for role, step in FAULT_STEPS for kind in FAULT_KINDS)
EPISODES = (
    "lease_break:dispatcher.put",
    "lease_break:placer.put",
    "operator_cancel:placer.put",
    "operator_reschedule:placer.put",
    "operator_cancel:dispatcher.put",
    "operator_reschedule:dispatcher.put",
)
TARGETS = (*POINTS, *TRANSPORT_FAULTS, *EPISODES)
#: Faults after which the request took effect and its answer was lost.
ANSWER_LOST = ("reset_after", "timeout_after")

_ID = re.compile(r'"id":\s*"(lab-[0-9]+)"')
_QID = re.compile(r"<MessageId>([^<]+)</MessageId>")
_ROW_KEY = re.compile(r"RowKey='([^']+)'")


def _classify(method: str, path: str, headers: Any, body: str) -> tuple[str, str]:
    """``(service, step)`` of one request, from its method, path, headers and body."""
    action = headers.get("x-ms-lease-action")
    if action:
        return "lease", str(action)
    if "/messages" in path:
        if method == "POST":
            return "queue", "put"
        return "queue", {"DELETE": "queue_delete", "PUT": "queue_update", "GET": "receive"}.get(method, method)
    if path.endswith("$batch") or "PartitionKey=" in path or "()" in path or path.endswith("Tables"):
        if method == "GET":
            return "table", "get" if "PartitionKey=" in path else "query"
        if method == "DELETE":
            return "table", "delete_one"
        kind = _table_write(body)
        if path.endswith("$batch"):
            return "table", kind
        return "table", {"claim": "claim_one", "give_back": "give_back"}.get(kind, kind)
    return "other", method


def _table_write(body: str) -> str:
    """What a table write (transaction or single merge) does."""
    if "QueueMessageId" in body:
        return "record"
    if re.search(r'"ClaimToken":\s*"[0-9a-f]{32}"', body):
        return "claim"
    if re.search(r'"ClaimToken":\s*""', body):
        return "give_back"
    if "DELETE " in body:
        return "delete"
    if "FailureCount" in body:
        return "count_failure"
    return "write"


@dataclass(slots=True)
class Write:
    """One put (or update) of a queue message, as the service took it."""

    message_id: str
    life: int
    seq: int
    visible_at: datetime
    due: datetime
    answer_lost: bool = False


@dataclass(slots=True)
class Life:
    """One shard's dispatcher "process": its clients and engines; once dead, every request it makes dies."""

    number: int
    shard: int
    clients: AzureClients
    view: TableDelayedMessageStore
    dispatcher: Dispatcher
    placer: Placer
    lease: BlobLease
    pool: ThreadPoolExecutor
    dead: bool = False
    died_at: int | None = None
    asks: int = 0


class LabLease(BlobLease):
    """The real lease whose renewals the lab makes (``Life`` asks), instead of a background thread."""

    def _renew_loop(self, stop: threading.Event) -> None:
        return


class LabHttp(HttpTransport):  # type: ignore[misc]
    """The innermost HTTP transport of a client: logs queue writes, and for a life's clients injects the armed fault."""

    def __init__(self, inner: Any, lab: AzureCrashLab, life: Callable[[], Life | None]) -> None:
        self.inner = inner
        self.lab = lab
        self.life = life

    def __enter__(self) -> LabHttp:
        self.inner.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self.inner.__exit__(*args)

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def send(self, request: Any, **kwargs: Any) -> Any:
        life = self.life()
        if life is not None and life.dead:
            raise InjectedCrash(f"life {life.number} is dead")
        body = request.body if isinstance(request.body, str) else (request.body or b"").decode("utf-8", "replace")
        service, step = _classify(request.method, urlparse(request.url).path, request.headers, body)
        role = "lease" if service == "lease" else self.lab.phase
        fault = self.lab.fault_for(life, role, step) if life is not None else None
        if fault is not None and fault.startswith("crash_before"):
            self.lab.die(life, fault)
        if fault is not None and fault.startswith("reset_before"):
            raise ServiceRequestError("lab: connection reset before the request was sent")
        if fault is not None and fault.startswith("throttled_503"):
            return _unavailable(request)
        response = self.inner.send(request, **kwargs)
        lost = fault is not None and fault.split(":")[0] in ANSWER_LOST
        self.lab.observed(request, response, step, body, life, answer_lost=lost)
        if fault is not None and fault.startswith("crash_after"):
            self.lab.die(life, fault)
        if lost:
            raise ServiceResponseError(f"lab: {fault.split(':')[0]} after the service took the request")
        if fault is not None and fault.split(":")[0] in ("lease_break", "operator_cancel", "operator_reschedule"):
            self.lab.episode(fault, life, body)
        return response


def _unavailable(request: Any) -> Any:
    """A 503 the service answered without doing the request."""
    raw = requests.Response()
    raw.status_code = 503
    raw.reason = "Service Unavailable"
    raw.headers["Content-Type"] = "application/xml"
    raw.headers["x-ms-error-code"] = "ServerBusy"
    raw._content = b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code><Message>lab</Message></Error>'
    raw.url = request.url
    return RequestsTransportResponse(request, raw)


@dataclass(slots=True)
class LabResult:
    """What a soak found."""

    seed: int
    ticks: int = 0
    messages: int = 0
    faults: int = 0
    crashes: int = 0
    crashes_by_point: dict[str, int] = field(default_factory=dict)
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    unreached: dict[str, int] = field(default_factory=dict)
    delivered: int = 0
    lost: int = 0
    lost_ids: list[str] = field(default_factory=list)
    duplicates: int = 0
    duplicates_by_cause: dict[str, int] = field(default_factory=dict)
    duplicates_per_crash: list[int] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    diagnoses: dict[str, Any] = field(default_factory=dict)
    early: int = 0
    stale_after_reschedule: int = 0
    error_queue: int = 0
    cancels_certain: int = 0
    certain_cancels_delivered: int = 0
    cancels_refused: int = 0
    reschedules_done: int = 0
    reschedules_refused: int = 0
    placed: int = 0
    pass_errors: int = 0
    receipts_after_receive: int = 0
    drain_errors: int = 0
    unlogged_copies: int = 0
    unparsed_puts: int = 0
    dispatched_puts: int = 0
    seconds: float = 0.0
    complete: bool = False

    @property
    def per_crash(self) -> tuple[float, float, int]:
        """Median, p99 and max of the duplicates each crash caused."""
        values = sorted(self.duplicates_per_crash) or [0]
        p99 = values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]
        return statistics.median(values), p99, values[-1]

    def sound(self) -> bool:
        """Nothing lost, no certain cancel delivered, nothing early or stale, every duplicate explained."""
        return not (
            self.lost
            or self.certain_cancels_delivered
            or self.early
            or self.stale_after_reschedule
            or self.error_queue
            or self.unexplained
            or self.unlogged_copies
        )


class AzureCrashLab:
    """One soak on one Azurite: the lives, the armed fault, the operator, the ledger."""

    def __init__(self, conn: str, seed: int, name: str, targets: tuple[str, ...] = TARGETS) -> None:
        self.conn = conn
        self.targets = targets
        self.rng = random.Random(seed)
        self.name = name
        self.clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
        self.result = LabResult(seed)
        self.config = AzureDelayedDeliveryConfig(
            table_name=name,
            container_name=name,
            connection_string=conn,
            lease_seconds=LEASE,
            claim_timeout=CLAIM,
            place_ahead=LEAD,
            shards=SHARDS,
            settings=DelayedDeliverySettings(batch_size=BATCH, max_concurrency=CONCURRENCY, error_queue=f"{name}e"),
        )
        self.phase = "dispatcher"
        self.seq = 0
        self._lock = threading.Lock()
        self.lives_made = 0
        self.clean = self._clients(None)
        self.sender = TableDelayedMessageStore(
            self.clean.tables.get_table_client(name), shards=SHARDS, claim_timeout=CLAIM
        )
        self.operator = TableDelayedMessageStore(
            self.clean.tables.get_table_client(name),
            shards=SHARDS,
            claim_timeout=CLAIM,
            queues=StorageQueueTransport(self.clean.queues),
        )
        self.sender.setup_infrastructure()
        self.container = self.clean.blobs.get_container_client(name)
        for shard in range(SHARDS):
            LabLease(self.container, shard, duration=LEASE).setup_infrastructure()
        admin = StorageQueueTransport(self.clean.queues)
        for queue in (*self.queues, self.config.settings.error_queue):
            admin.create_queue(queue)
        self.lives: dict[int, Life] = {}
        for shard in range(SHARDS):
            self.lives[shard] = self._life(shard)
        #: The armed target, how many matching requests it lets pass first, the tick it was armed at.
        self.cycle: list[str] = []
        self.armed: str | None = None
        self.skip = 0
        self.armed_at = 0
        self.due: dict[str, datetime] = {}
        self.stored: list[str] = []
        self.writes: dict[str, Write] = {}
        self.copies: dict[str, list[str]] = {}
        self.cancelled: set[str] = set()
        self.rescheduled_at: dict[str, list[tuple[int, datetime]]] = {}
        self.deaths: dict[int, int] = {}
        self.crash_ids: list[int] = []
        self.next_id = 0
        self.by_hash: dict[str, str] = {}
        self.settled: dict[tuple[int, str], int] = {}
        self.unparsed_puts = 0
        self.events: dict[str, list[str]] = {}

    @property
    def queues(self) -> tuple[str, ...]:
        """The destination queues (named after the lab's table, so soaks can share one Azurite)."""
        return tuple(f"{self.name}{q}" for q in QUEUES)

    # -- building --------------------------------------------------------------

    def _clients(self, life: Callable[[], Life | None] | None) -> AzureClients:
        """Service clients whose HTTP transports go through ``LabHttp`` (faults only for a life's)."""
        budget = RunBudget()
        table, blob, queue = _client_options(self.config, budget, False)
        # the queue client's back-offs compressed like the lab's time (the SDK's first is 15 s)
        queue["retry_policy"] = BudgetedRetry(budget, initial_backoff=0.1, increment_base=1.5)
        blob["retry_total"] = 1
        who = life or (lambda: None)
        made = []
        for kind, options in ((TableServiceClient, table), (BlobServiceClient, blob), (QueueServiceClient, queue)):
            options = {**options, "transport": LabHttp(options["transport"], self, who)}
            made.append(kind.from_connection_string(self.conn, **options))
        return AzureClients(made[0], made[1], made[2], budget)

    def _life(self, shard: int) -> Life:
        """A fresh "process" for ``shard``: new clients, view, dispatcher, placer and lease object."""
        self.lives_made += 1
        holder: list[Life] = []
        clients = self._clients(lambda: holder[0] if holder else None)
        store = TableDelayedMessageStore(clients.tables.get_table_client(self.name), shards=SHARDS, claim_timeout=CLAIM)
        view = store.for_shards([shard], exclusive=True)
        transport = StorageQueueTransport(
            clients.queues, route="table", bound=self.config.send_bound, budget=clients.budget
        )
        policy = self.config.destination_policy
        dispatcher = Dispatcher(
            view, GuardedTransport(transport, policy), self.config.settings, clock=self.clock, overlap_removal=True
        )
        placer = Placer(
            store.table, SHARDS, shard, transport, policy, lead=LEAD, clock=self.clock, claim_timeout=CLAIM,
            concurrency=CONCURRENCY, batch=PLACE_BATCH,
        )  # fmt: skip
        lease = LabLease(
            clients.blobs.get_container_client(self.name),
            shard,
            duration=LEASE,
            renew_every=10.0,
            monotonic=lambda: self.clock.now().timestamp(),
        )
        life = Life(self.lives_made, shard, clients, view, dispatcher, placer, lease, ThreadPoolExecutor(CONCURRENCY))
        holder.append(life)
        return life

    # -- faults ----------------------------------------------------------------

    def arm_next(self) -> None:
        """Arm the next target of the seeded cycle."""
        if not self.cycle:
            self.cycle = [t for t in self.targets if self.result.unreached.get(t, 0) < GIVE_UP]
            self.rng.shuffle(self.cycle)
        self.armed = self.cycle.pop()
        self.skip = self.rng.randrange(3)
        self.armed_at = self.result.ticks

    def fault_for(self, life: Life | None, role: str, step: str) -> str | None:
        """The armed target when this request is the one it fires at (then it is disarmed)."""
        with self._lock:
            armed = self.armed
            if armed is None or life is None or not armed.endswith(f":{role}.{step}"):
                return None
            if self.skip > 0:
                self.skip -= 1
                return None
            self.armed = None
            kind = armed.split(":")[0]
            self.result.faults += 1
            if kind.startswith("crash"):
                self.result.crashes += 1
                self.result.crashes_by_point[armed] = self.result.crashes_by_point.get(armed, 0) + 1
            else:
                self.result.faults_by_kind[armed] = self.result.faults_by_kind.get(armed, 0) + 1
            return armed

    def die(self, life: Life | None, point: str) -> None:
        """``life`` dies here: it and every later request of it raise ``InjectedCrash``."""
        assert life is not None
        with self._lock:
            self.seq += 1
            life.dead = True
            life.died_at = self.seq
            self.deaths[life.number] = self.seq
            self.crash_ids.append(life.number)
        raise InjectedCrash(point)

    def episode(self, fault: str, life: Life | None, body: str) -> None:
        """A fault that is not a crash, fired right after a put of ``life`` (before its record)."""
        assert life is not None
        kind = fault.split(":")[0]
        found = _ID.search(body)
        if kind == "lease_break":
            self._lease_break(life)
        elif found is not None and kind == "operator_cancel":
            self.cancel(found.group(1))
        elif found is not None:
            self.reschedule(found.group(1))

    def _lease_break(self, old: Life) -> None:
        """Break ``old``'s lease from outside; a second holder takes the shard and runs while ``old`` goes on until its
        next renewal (claims keep the two apart)."""
        BlobLeaseClient(self.container.get_blob_client(lease_blob_name(old.shard))).break_lease(lease_break_period=0)
        new = self._life(old.shard)
        self.lives[old.shard] = new
        phase = self.phase
        try:
            self.turn(new)
        except Exception:
            self.result.pass_errors += 1
        finally:
            self.phase = phase

    # -- the ledger ------------------------------------------------------------

    def observed(
        self, request: Any, response: Any, step: str, body: str, life: Life | None, *, answer_lost: bool
    ) -> None:
        """Log a queue write the service took: a put (its queue message id) or an update (new visibility)."""
        if step in ("record", "delete") and life is not None and 200 <= response.status_code < 300:
            self._settled(life, body, response)
        if step not in ("put", "queue_update") or not 200 <= response.status_code < 300:
            return
        query = dict(p.split("=", 1) for p in urlparse(request.url).query.split("&") if "=" in p)
        hidden = int(query.get("visibilitytimeout", "0") or 0)
        now = self.clock.now()
        with self._lock:
            self.seq += 1
            if step == "put":
                found, qid = _ID.search(body), _QID.search(response.text())
                if found is None or qid is None:
                    self.unparsed_puts += 1  # the error queue's copies (counted from the error queue), or a lab bug
                    return
                mid = found.group(1)
                self.writes[qid.group(1)] = Write(
                    mid, life.number if life else 0, self.seq, now + timedelta(seconds=hidden),
                    self.due.get(mid, now), answer_lost,
                )  # fmt: skip
            else:
                qid_path = urlparse(request.url).path.rsplit("/", 1)[-1]
                write = self.writes.get(qid_path)
                if write is not None:  # an operator's reschedule: judged against the new time (``verdict``)
                    write.visible_at, write.seq = now + timedelta(seconds=hidden), self.seq
                    write.due = write.visible_at

    def _settled(self, life: Life, body: str, response: Any) -> None:
        """Note the messages whose put ``life`` recorded (placed) or removed (sent) in a transaction that succeeded."""
        try:
            answer = response.internal_response.content.decode("utf-8", "replace")
        except Exception:
            return
        if "HTTP/1.1 4" in answer or "HTTP/1.1 5" in answer:
            return  # a transaction that failed changed nothing
        with self._lock:
            self.seq += 1
            for key in _ROW_KEY.findall(body):
                mid = self.by_hash.get(key.rsplit("_", 1)[-1]) or self.by_hash.get(key[len(rows.INDEX_PREFIX) :])
                if mid is not None:
                    self.settled[(life.number, mid)] = self.seq

    def send_round(self) -> None:
        """Store a round of messages (a burst due in one second every ``BURST_EVERY`` ticks)."""
        now = self.clock.now()
        if self.result.ticks % BURST_EVERY == 0:
            ahead = self.rng.choice((1.0, 8.0, 15.0))
            due = [now + timedelta(seconds=ahead)] * BURST
        else:
            due = [now + timedelta(seconds=self.rng.choice((0.0, 1.0, 5.0, 12.0, 30.0))) for _ in range(ROUND)]
        messages = []
        for when in due:
            mid = f"lab-{self.next_id:07d}"
            self.next_id += 1
            destination = self.queues[self.next_id % len(self.queues)]
            messages.append(DelayedMessage(mid, destination, mid.encode(), when))
            self.due[mid] = when
            self.by_hash[rows.id_hash(mid)] = mid
        for attempt in range(5):  # the sender's own trouble (Azurite drops idle connections): store again, idempotent
            try:
                self.sender.store_many(messages)
                break
            except DelayedDeliveryError:
                if attempt == 4:
                    raise
                time.sleep(0.5)
        self.stored.extend(m.message_id for m in messages)
        self.result.messages += len(messages)

    def cancel(self, mid: str) -> None:
        """An operator's cancel; a certain one is remembered (it must never arrive)."""
        self.events.setdefault(mid, []).append(f"cancel@{self.seq}")
        try:
            if self.operator.remove(mid):
                self.cancelled.add(mid)
                self.result.cancels_certain += 1
        except MessageInFlightError:
            self.result.cancels_refused += 1
        except DelayedDeliveryError:
            self.result.cancels_refused += 1

    def reschedule(self, mid: str) -> None:
        """An operator's reschedule a few seconds on; when done, what arrives must honour the new time."""
        when = self.clock.now() + timedelta(seconds=self.rng.choice((3.0, 10.0, 25.0)))
        self.events.setdefault(mid, []).append(f"reschedule@{self.seq}->{when}")
        try:
            done = self.operator.reschedule(mid, when)
        except (MessageInFlightError, DelayedDeliveryError) as exc:
            self.events[mid].append(f"refused {type(exc).__name__}")
            self.result.reschedules_refused += 1
            return
        if done:
            with self._lock:
                self.seq += 1
                self.due[mid] = when
                self.rescheduled_at.setdefault(mid, []).append((self.seq, when))
            self.result.reschedules_done += 1

    # -- running ---------------------------------------------------------------

    def keep_going(self, life: Life) -> bool:
        """The lease as the dispatcher and placer ask it, renewed every ``RENEW_CALLS`` asks."""
        life.asks += 1
        if life.asks % RENEW_CALLS == 0:
            life.lease.renew()
        return not life.dead and life.lease.keep_going()

    def turn(self, life: Life) -> None:
        """One tick of one life: lease, placement pass, dispatch pass (``InjectedCrash`` propagates)."""
        self.phase = "lease"
        if not life.lease.held and not life.lease.try_acquire():
            return
        life.lease.renew()
        go = lambda: self.keep_going(life)  # noqa: E731
        self.phase = "placer"
        report = PlacementReport()
        life.placer.sweep()
        try:
            for _ in range(6):
                if not (go() and life.placer.place_batch(life.pool, go, report)):
                    break
        except DelayedDeliveryError:
            pass  # storage trouble: the next pass tries again (``Placer.run``)
        self.result.placed += report.placed
        self.phase = "dispatcher"
        try:
            life.dispatcher.dispatch_due(None, keep_going=go)
        except Exception:
            self.result.pass_errors += 1
            self.retire(life)
            life.lease.release()
            if self.lives.get(life.shard) is life:
                self.lives[life.shard] = self._life(life.shard)
            return
        if not life.lease.keep_going():
            life.view.release_claims()  # as ``run_shard`` does after a lost lease
            life.lease.abandon()

    def tick(self) -> None:
        """One simulated second."""
        if self.armed is None:
            self.arm_next()
        elif self.result.ticks - self.armed_at > QUIET_TICKS:
            self.result.unreached[self.armed] = self.result.unreached.get(self.armed, 0) + 1
            self.arm_next()
        self.send_round()
        self.operate()
        for shard in range(SHARDS):
            life = self.lives[shard]
            try:
                self.turn(life)
            except InjectedCrash:
                self.crashed(life)
            if self.lives[shard] is not life and not life.dead:
                self.retire(life)  # replaced by a lease break's second holder
            if self.armed is None:
                self.arm_next()  # the next fault may fire in this tick already
        self.clock.advance(1)
        self.drain()
        self.result.ticks += 1

    def operate(self) -> None:
        """Now and then an operator cancels or reschedules a message still to come."""
        if not self.stored or self.rng.random() > 0.5:
            return
        mid = self.stored[self.rng.randrange(max(0, len(self.stored) - 200), len(self.stored))]
        if self.rng.random() < 0.6:
            self.cancel(mid)
        else:
            self.reschedule(mid)

    def crashed(self, life: Life) -> None:
        """Replace a dead life: its lease expires (broken here), the clock moves past its claims."""
        life.dead = True
        if life.number not in self.deaths:  # died of a request of a dead sibling thread: same death
            self.deaths[life.number] = self.seq
        self.retire(life)
        with suppress(Exception):
            BlobLeaseClient(self.container.get_blob_client(lease_blob_name(life.shard))).break_lease(
                lease_break_period=0
            )
        self.clock.advance(CLAIM + 1)
        if self.lives.get(life.shard) is life:
            self.lives[life.shard] = self._life(life.shard)

    def retire(self, life: Life) -> None:
        """Stop a life's pools (a dead one's threads die at their next request)."""
        for stop in (life.dispatcher.close, lambda: life.pool.shutdown(wait=True)):
            with suppress(BaseException):
                stop()

    def drain(self) -> None:
        """Receive and delete what is visible on the destination queues and the error queue (a failed call: the
        next tick drains again; a copy received and not deleted comes back after its visibility timeout: same id)."""
        try:
            self._drain()
        except AzureError:
            self.result.drain_errors += 1

    def _drain(self) -> None:
        for name in (*self.queues, self.config.settings.error_queue):
            queue = self.clean.queues.get_queue_client(name)
            for message in queue.receive_messages(messages_per_page=32, visibility_timeout=60):
                if name == self.config.settings.error_queue:
                    self.result.error_queue += 1
                else:
                    copies = self.copies.setdefault(decode_envelope(message.content).message_id, [])
                    if message.id not in copies:  # received again after a failed delete: the same copy
                        copies.append(message.id)
                try:
                    queue.delete_message(message)
                except ResourceNotFoundError:  # deleted since the receive, by another receipt (``verdict``)
                    self.result.receipts_after_receive += 1

    def finish(self, deadline: float) -> None:
        """No more faults or messages: run until the table is empty and every copy has arrived."""
        self.armed = None
        self.cycle = []
        for life in list(self.lives.values()):
            if life.dead:
                self.crashed(life)
        self.clock.advance(LEAD + CLAIM + 30)
        while time.monotonic() < deadline:
            for shard in range(SHARDS):
                self.turn(self.lives[shard])
            self.clock.advance(1)
            self.drain()
            if self.sender.count() == 0 and self._queues_empty():
                break
            time.sleep(0.5)
        for life in self.lives.values():
            self.retire(life)

    def _queues_empty(self) -> bool:
        for name in (*self.queues, self.config.settings.error_queue):
            props = self.clean.queues.get_queue_client(name).get_queue_properties()
            if props.approximate_message_count:
                return False
        return True

    def diagnose(self, mid: str) -> dict[str, Any]:
        """What the lab knows of one message: its due, its writes and copies, its rows now, the operator's doings."""
        writes = [(q, asdict(w)) for q, w in self.writes.items() if w.message_id == mid]
        located = self.sender._rows.locate(mid)
        row = None if located is None else self.sender._rows.read(*located, "diagnose")
        return {
            "due": str(self.due.get(mid)),
            "writes": writes,
            "copies": [(q, q in self.writes) for q in self.copies.get(mid, [])],
            "row": None if row is None else {k: str(v) for k, v in row.items() if k not in ("Body",)},
            "deaths": {n: self.deaths[n] for w in writes for n in [w[1]["life"]] if n in self.deaths},
            "cancelled": mid in self.cancelled,
            "rescheduled": [(s, str(t)) for s, t in self.rescheduled_at.get(mid, [])],
            "events": self.events.get(mid, []),
        }

    def verdict(self) -> LabResult:
        """Lost, certain cancels delivered, early or stale copies, duplicates explained (``LabResult``)."""
        r = self.result
        per_crash: Counter[int] = Counter()
        causes: Counter[str] = Counter()
        r.delivered = r.lost = r.duplicates = r.early = r.stale_after_reschedule = 0
        r.certain_cancels_delivered = 0
        r.lost_ids, r.unexplained = [], []
        for mid in self.stored:
            arrived = self.copies.get(mid, [])
            if any(q not in self.writes for q in arrived):
                r.unlogged_copies += sum(q not in self.writes for q in arrived)
                r.unexplained.append(mid)
            copies = sorted((self.writes[q] for q in arrived if q in self.writes), key=lambda w: w.seq)
            if mid in self.cancelled:
                r.certain_cancels_delivered += bool(arrived)
            elif not arrived:
                r.lost += 1
                r.lost_ids.append(mid)
            r.delivered += bool(arrived)
            for write in copies:
                r.early += write.visible_at < write.due
                # a copy written before a reschedule answered done must not show before the new time
                r.stale_after_reschedule += any(
                    end > write.seq and write.visible_at < when for end, when in self.rescheduled_at.get(mid, [])
                )
            for earlier in copies[:-1]:
                r.duplicates += 1
                # its life died (mid-put, or after it) without recording or removing it
                died = self.deaths.get(earlier.life)
                if died is not None and self.settled.get((earlier.life, mid), -1) < earlier.seq:
                    per_crash[earlier.life] += 1
                    causes["crash"] += 1
                elif earlier.answer_lost:
                    causes["answer_lost"] += 1
                else:
                    causes["unexplained"] += 1
                    r.unexplained.append(mid)
        r.diagnoses = {mid: self.diagnose(mid) for mid in [*r.lost_ids[:10], *r.unexplained[:10]]}
        r.duplicates_by_cause = dict(causes)
        r.duplicates_per_crash = [per_crash.get(n, 0) for n in self.deaths]
        r.dispatched_puts = len(self.writes)
        r.unparsed_puts = self.unparsed_puts
        return r


def soak(
    conn: str,
    *,
    faults: int,
    seed: int,
    name: str,
    timeout: float,
    report: Callable[[LabResult], None] | None = None,
    targets: tuple[str, ...] = TARGETS,
) -> LabResult:
    """Tick until ``faults`` faults have fired (or ``timeout`` s), then finish and judge."""
    started = time.monotonic()
    lab = AzureCrashLab(conn, seed, name, targets)
    last = started
    with _operators_on(lab.clock):
        while lab.result.faults < faults and time.monotonic() - started < timeout:
            lab.tick()
            if report is not None and time.monotonic() - last > 30:
                last = time.monotonic()
                report(lab.result)
        lab.finish(time.monotonic() + 180)
    result = lab.verdict()
    result.seconds = round(time.monotonic() - started, 1)
    result.complete = True
    return result


@contextmanager
def _operators_on(clock: ManualClock) -> Iterator[None]:
    """Operators read the lab's clock (their in-flight and visible-by-now decisions)."""

    class LabDatetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return clock.now()

    with ExitStack() as stack:
        for module in (table_store, placed_ops):
            stack.enter_context(mock.patch.object(module, "datetime", LabDatetime))
        yield


def table(result: LabResult) -> str:
    """The soak's figures as a Markdown table."""
    median, p99, top = result.per_crash
    rows = [
        ("faults (crashes + transport faults + episodes)", f"{result.faults:,} ({result.crashes:,} + "
         f"{result.faults - result.crashes:,})"),
        ("messages / delivered", f"{result.messages:,} / {result.delivered:,}"),
        ("lost", result.lost),
        ("certain cancels delivered", f"{result.certain_cancels_delivered} of {result.cancels_certain}"),
        ("early / stale after reschedule", f"{result.early} / {result.stale_after_reschedule}"),
        ("error queue", result.error_queue),
        ("duplicates (by cause)", f"{result.duplicates:,} {result.duplicates_by_cause}"),
        ("duplicates per crash: median / p99 / max", f"{median:g} / {p99} / {top}"),
        ("unreached targets", len(result.unreached)),
        ("ticks / seconds", f"{result.ticks:,} / {result.seconds:,}"),
    ]  # fmt: skip
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def main() -> None:
    """``python -m tests.reliability.azurecrashlab --faults 1000``."""
    from tests.fixtures.azurite import running_azurite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/azurecrashlab.json"))
    args = parser.parse_args()
    args.json.parent.mkdir(parents=True, exist_ok=True)

    def checkpoint(r: LabResult) -> None:
        _write(args.json, r)
        print(f"[{r.ticks} ticks] faults {r.faults}, crashes {r.crashes}, messages {r.messages}", file=sys.stderr)

    with contextmanager(running_azurite)() as azurite:
        result = soak(
            azurite.connection_string, faults=args.faults, seed=args.seed, name="lab" + str(args.seed),
            timeout=args.minutes * 60, report=checkpoint,
        )  # fmt: skip
        _write(args.json, result)
        print(table(result))
        sys.exit(0 if result.sound() else 1)


def _write(path: Path, result: LabResult) -> None:
    """The figures as JSON, atomically."""
    payload = {**asdict(result), "per_crash_median_p99_max": result.per_crash}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(path)


if __name__ == "__main__":
    main()
