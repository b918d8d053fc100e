"""What one timer run does: for every shard, hold its lease and dispatch until the run's budget ends.

Each shard gets its own thread, lease and core ``Dispatcher`` (with ``keep_going = lease.keep_going``).
A shard whose lease is held elsewhere is retried every second, so a dead holder is replaced within the
lease duration plus one second; a lost lease stops that shard's dispatching at once and it goes back to
trying to acquire. Idle sleeps are capped at one second, so a row stored by another process is sent
within about a second of falling due, although the timer fires only once a minute.

Release control (``release_rates``): every shard's dispatcher books its slots in the one schedule of the table
(``release_state.SharedBlobReleaseState``), so a cap is shared by what each shard has due, and places each message
at its slot with the queue's visibility timeout (up to 7 days); a slot further away waits in the table, re-keyed
by the slot, until it comes (``TableDelayedMessageStore.defer``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from .. import logfields as lf
from ..clock import Clock, SystemClock
from ..dispatcher import Dispatcher, DispatchReport
from ..ports import ReleaseStateStore
from ..settings import DelayedDeliverySettings
from .blob_lease import BlobLease
from .config import AzureClients, AzureDelayedDeliveryConfig
from .destinations import GuardedTransport
from .heartbeat import Heartbeat, write_heartbeat
from .host_share import HostRegistry, ShareGate
from .layout import resolve_shards
from .placement import PlacementReport, Placer
from .release_state import SharedBlobReleaseState
from .storage_queue import StorageQueueTransport
from .table_store import TableDelayedMessageStore
from .telemetry import DispatchMetrics

__all__ = ["AzureDispatcherHost", "RunSummary", "ShardRun"]

#: Longest sleep between polls inside a run (the "≤ 1 s granularity").
POLL_SECONDS = 1.0

_log = logging.getLogger("delayed_delivery.azure.runner")


@dataclass(slots=True)
class ShardRun:
    """What one run did for one shard."""

    shard: int
    acquisitions: int = 0
    lease_lost: int = 0
    report: DispatchReport = field(default_factory=DispatchReport)
    placement: PlacementReport = field(default_factory=PlacementReport)


@dataclass(slots=True)
class RunSummary:
    """What one timer run did."""

    enabled: bool
    shards: list[ShardRun] = field(default_factory=list)

    @property
    def dispatched(self) -> int:
        """Messages sent and removed across shards."""
        return sum(s.report.dispatched for s in self.shards)

    @property
    def placed(self) -> int:
        """Messages placed on their queues ahead of their due time across shards."""
        return sum(s.placement.placed for s in self.shards)

    @property
    def moved_to_error_queue(self) -> int:
        """Messages sent to the error queue across shards."""
        return sum(s.report.moved_to_error_queue for s in self.shards)


class AzureDispatcherHost:
    """Wires the Table store, blob leases and Storage Queue transport to the core dispatcher."""

    def __init__(
        self,
        config: AzureDelayedDeliveryConfig,
        clients: AzureClients | None = None,
        *,
        clock: Clock | None = None,
        metrics: DispatchMetrics | None = None,
        renew_every: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        heartbeat: bool = True,
    ) -> None:
        self.config = config
        self.clients = clients or AzureClients.create(config)
        self.clock = clock or SystemClock()
        self.metrics = metrics or DispatchMetrics()
        self.renew_every = renew_every
        self._monotonic = monotonic
        #: Write the heartbeat ``azure verify`` reads after each run (off for dispatchers that are not the timer).
        self.heartbeat = heartbeat
        self.store = TableDelayedMessageStore(
            self.clients.tables.get_table_client(config.table_name),
            shards=config.shards,
            claim_timeout=config.claim_timeout,
        )
        self.container = self.clients.blobs.get_container_client(config.container_name)
        # every put ends within the send timeout (its retries included), and none starts that its claim cannot outlast
        self.transport = StorageQueueTransport(
            self.clients.queues, route="table", bound=config.send_bound, budget=self.clients.budget
        )
        #: The hosts dispatching this table (each run takes ⌈shards / hosts alive⌉ at once: ``host_share.py``).
        self.hosts = HostRegistry(self.container, uuid.uuid4().hex, self.clock.now)
        self.settings: DelayedDeliverySettings = config.settings.with_(
            max_idle_sleep=min(config.settings.max_idle_sleep, POLL_SECONDS)
        )
        self._ready = False
        #: Seconds a run ends before its budget so that its tail (the last removals, giving back claims, releasing
        #: leases) fits too: a tenth of the first run, then grown by each run's overrun and shrunk by its slack (at
        #: most half a run).
        self._tail: float | None = None
        #: Each shard's measured time per message, carried from one run's dispatcher to the next.
        self._pace: dict[int, float] = {}

    def adopt_table_shards(self) -> int:
        """Use the shard count the table records (``ConfigurationError`` when this process was set to another)."""
        shards = resolve_shards(self.store.table, self.config.shards, configured=self.config.shards_configured)
        if shards != self.store.shards:
            self.config = self.config.with_shards(shards)
            self.store = TableDelayedMessageStore(
                self.store.table, shards=shards, claim_timeout=self.config.claim_timeout
            )
        return shards

    def lease(self, shard: int) -> BlobLease:
        """A fresh lease object for ``shard``."""
        return BlobLease(self.container, shard, duration=self.config.lease_seconds, renew_every=self.renew_every)

    def release_schedule(self, shard: int) -> tuple[ReleaseStateStore, float]:
        """Where ``shard``'s dispatcher books its release slots, and its share of each cap: the table's one schedule,
        the whole cap (every shard books there, so each gets what its due messages ask for)."""
        return SharedBlobReleaseState(self.container, self.config.shards, clock=self.clock), 1.0

    def setup_infrastructure(self) -> None:
        """Create the table, the container, one lease blob per shard and the error queue (idempotent); record the
        table's shard count in it, or check this process's against the one it records (``layout.resolve_shards``)."""
        self.store.setup_infrastructure()
        self.adopt_table_shards()
        for shard in range(self.config.shards):
            self.lease(shard).setup_infrastructure()
        self.transport.create_queue(self.settings.error_queue)
        self._ready = True

    def run(self, budget: float | None = None) -> RunSummary:
        """One timer run: every shard in parallel until ``budget`` (default ``run_seconds``) ends."""
        if not self.settings.enabled:
            _log.info("delayed delivery is disabled; nothing to do", extra={lf.EVENT: "disabled"})
            return self._beat(RunSummary(enabled=False))
        if not self._ready:
            self.setup_infrastructure()
        else:
            self.adopt_table_shards()  # every run: a reshard since the last one is followed, or refused
        seconds = self.config.run_seconds if budget is None else budget
        started = self._monotonic()
        tail = seconds / 10 if self._tail is None else self._tail
        deadline = started + max(0.0, seconds - tail)
        shards = range(self.config.shards)
        gate = self.share_gate(seconds)
        self.clients.budget.start(deadline, self._monotonic)  # the queue client's retry back-offs end with the run
        try:
            with ThreadPoolExecutor(max_workers=len(shards), thread_name_prefix="shard") as pool:
                runs = list(pool.map(lambda s: self.run_shard(s, deadline, gate), shards))
        finally:
            self.clients.budget.end()
        took = self._monotonic() - started
        self._tail = min(seconds / 2, max(0.0, tail + took - seconds))
        _log.info(
            "timer run finished",
            extra={
                lf.CLOUD: "azure",
                lf.EVENT: lf.EVENT_TIMER_RUN,
                "run_seconds": seconds,
                "took_s": round(took, 3),
                lf.OVERRUN_S: round(max(0.0, took - seconds), 3),
            },
        )
        return self._beat(RunSummary(enabled=True, shards=runs))

    def share_gate(self, seconds: float) -> ShareGate:
        """Announce this host for the run (and the gap to the next) and gate it to its share of the shards; shards
        still free a lease duration (plus two polls) into the run may be taken beyond it."""
        lease = self.config.lease_seconds
        hosts = self.hosts.announce(seconds + 2 * lease + 10)
        return ShareGate.of(self.config.shards, hosts, self._monotonic() + lease + 2 * POLL_SECONDS, self._monotonic)

    def _beat(self, summary: RunSummary) -> RunSummary:
        """Write the heartbeat ``azure verify`` reads (never fails the run)."""
        if not self.heartbeat:
            return summary
        heartbeat = Heartbeat(
            self.clock.now(), summary.enabled, self.config.shards, summary.dispatched, summary.moved_to_error_queue
        )
        write_heartbeat(self.container, heartbeat)
        return summary

    def _place_ahead(self, shard: int, lease: BlobLease, deadline: float) -> Future[PlacementReport] | None:
        """Start placing ``shard``'s rows due within ``place_ahead`` while the lease lasts (None when it is off)."""
        if self.config.place_ahead <= 0:
            return None
        placer = Placer(
            self.store.table,
            self.store.shards,
            shard,
            self.transport,
            self.config.destination_policy,
            lead=self.config.place_ahead,
            clock=self.clock,
            claim_timeout=self.config.claim_timeout,
            concurrency=self.settings.max_concurrency,
            release_rates=self.settings.release_rates,
        )
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"placer{shard}")
        future = pool.submit(placer.run, lambda: lease.keep_going() and self._monotonic() < deadline)
        pool.shutdown(wait=False)
        return future

    def run_shard(self, shard: int, deadline: float, gate: ShareGate | None = None) -> ShardRun:
        """Acquire ``shard``'s lease (retrying each second) when ``gate`` has room, dispatch while held, until
        ``deadline``."""
        result = ShardRun(shard)
        lease = self.lease(shard)
        view, dispatcher = self._dispatcher(shard)
        try:
            while (remaining := deadline - self._monotonic()) > 0:
                if gate is not None and not gate.reserve():
                    time.sleep(min(POLL_SECONDS, max(0.0, remaining)))  # this host holds its share
                    continue
                if not lease.try_acquire():
                    if gate is not None:
                        gate.unreserve()
                    time.sleep(min(POLL_SECONDS, max(0.0, remaining)))
                    continue
                result.acquisitions += 1
                placing = self._place_ahead(shard, lease, deadline)
                report = dispatcher.dispatch_due(
                    remaining, wait_for_due=True, keep_going=lease.keep_going, within_budget=True
                )
                if placing is not None:
                    result.placement.merge(placing.result())
                view.release_claims()  # rows fetched but not sent (lease lost, budget over): fetchable again at once
                result.report.merge(report)
                if lease.keep_going():
                    break  # the budget is over, or what is left of it cannot cover a batch
                if gate is not None:
                    gate.unreserve()
                if deadline - self._monotonic() > 0:
                    result.lease_lost += 1
                    lease.abandon()
        finally:
            lease.release()
            self._pace[shard] = dispatcher.seconds_per_message
            dispatcher.close()
            self.metrics.record(result.report, shard, lease_lost=result.lease_lost)
        _log_shard_run(result)
        return result

    def _dispatcher(self, shard: int) -> tuple[TableDelayedMessageStore, Dispatcher]:
        """``shard``'s exclusive view of the table and the dispatcher over it (its pace carried from the last run)."""
        guarded = GuardedTransport(self.transport, self.config.destination_policy)  # allow-list: destinations.py
        # the lease makes this the shard's only dispatcher: its fetches skip what it holds, removal overlaps the next
        # batch; its claims are written to the table all the same (the in-flight marks operators see)
        view = self.store.for_shards([shard], exclusive=True)
        schedule, share = self.release_schedule(shard)
        dispatcher = Dispatcher(
            view,
            guarded,
            self.settings,
            clock=self.clock,
            overlap_removal=True,
            release_share=share,
            release_state=schedule,
            log_fields={lf.CLOUD: "azure"},
        )
        dispatcher.seconds_per_message = self._pace.get(shard, 0.0)
        return view, dispatcher


def _log_shard_run(result: ShardRun) -> None:
    """The ``shard_run`` line of one shard's run."""
    _log.info(
        "shard run finished",
        extra={
            lf.CLOUD: "azure",
            lf.EVENT: "shard_run",
            lf.SHARD: result.shard,
            "dispatched": result.report.dispatched,
            "placed": result.placement.placed,
            "failed_attempts": result.report.failed_attempts,
            "moved_to_error_queue": result.report.moved_to_error_queue,
            "lease_lost": result.lease_lost,
        },
    )
