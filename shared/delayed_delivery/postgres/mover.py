"""The batch mover: moves due rows out of the PostgreSQL store in batches, by the database clock.

Settings: ``batch_size`` (default ``settings.batch_size``, 100); ``look_ahead`` (seconds, default 0; up to
``max_native_delay``, the delaying transport's longest native delay, SQS's 900 s by default); ``schedule`` (poll
backoff 500 ms doubling to ``settings.max_idle_sleep``); the core ``DelayedDeliverySettings`` for retries and
breakers.

Guarantees:

- Same database (``PostgresQueueTransport`` on the store's database): one statement claims up to
  ``batch_size`` due rows with ``FOR UPDATE SKIP LOCKED``, deletes them and inserts them into the
  queue table, in one transaction: **exactly once**, any number of movers, no leader.
- Any other transport: claim a batch (the store's claim, on the database clock), send each
  message, then remove the sent ones in one statement: **at-least-once** (a crash between send
  and removal re-sends after the claim expires). Failures are counted, backed off and sent to
  the error queue by the core dispatcher.
- Look-ahead (for SQS): with ``look_ahead=900`` the mover also claims rows due within the next
  900 s and hands each to a ``DelayingTransport`` with ``delay_seconds`` = the time left on the
  database clock, rounded up, so a timer firing once a minute still delivers to the second and
  never early.
- ``run`` polls with a backoff from 500 ms up to a cap, never sleeping past the next due time,
  and wakes at once on the store's ``NOTIFY`` (a separate listening connection).
- Release control (``settings.release_rates``): each capped destination's slots come from a schedule table every
  mover shares (``release.py``), planned in the same transaction as the move, so the cap holds for any number of
  movers and exactly-once still holds. A message whose slot has not come is deferred in the delays table and moved
  at its slot; over another transport, one that can delay (``DelayingTransport``) places it at its slot instead,
  when that is within ``max_native_delay``. ``look_ahead`` is for uncapped deliveries only: with release rates it
  must be 0.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from .. import logfields as lf
from ..clock import Clock, SystemClock
from ..dispatcher import Dispatcher
from ..errors import ConfigurationError
from ..model import DelayedMessage
from ..pacing import Release
from ..ports import CriticalErrorCallback, Transport, claim_of, slot_of
from ..release import ReleaseRates
from ..settings import DelayedDeliverySettings
from ..validation import is_whole
from .connection import same_database
from .move_sql import move_statement, paced_statements
from .notify import DueListener
from .queue import PostgresQueueTransport
from .release import SharedReleaseSchedule
from .store import PostgresDelayedMessageStore

__all__ = ["DelayingTransport", "MoveReport", "PollSchedule", "PostgresBatchMover", "native_delay_seconds"]

_log = logging.getLogger("delayed_delivery.postgres.mover")


@runtime_checkable
class DelayingTransport(Protocol):
    """A transport that can hold a message for a short native delay (SQS ``DelaySeconds``)."""

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        """Deliver ``message`` to its destination after ``delay_seconds`` (0 = now)."""
        ...


def native_delay_seconds(due_at: datetime, now: datetime, cap: int) -> int:
    """Whole seconds to hold a message due at ``due_at`` (rounded up: never early), clamped to ``[0, cap]``."""
    return min(cap, max(0, math.ceil((due_at - now).total_seconds())))


@dataclass(frozen=True, slots=True)
class PollSchedule:
    """Polling backoff: ``initial`` seconds, doubling while idle up to ``cap``."""

    initial: float = 0.5
    cap: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap:
            raise ConfigurationError("poll schedule needs 0 < initial <= cap")

    def next_interval(self, previous: float | None, moved: int) -> float:
        """The interval after a poll that moved ``moved`` rows: reset when busy, double when idle."""
        if previous is None or moved > 0:
            return self.initial
        return min(self.cap, previous * 2)

    def sleep_for(self, interval: float, until_next_due: float | None) -> float:
        """How long to sleep: the interval, but never past the known next due time."""
        if until_next_due is None:
            return interval
        return max(0.0, min(interval, until_next_due))


@dataclass(frozen=True, slots=True)
class MoveReport:
    """What one or more mover calls did."""

    moved: int = 0
    failed_attempts: int = 0
    moved_to_error_queue: int = 0
    batches: int = 0
    full_batch: bool = False
    exactly_once: bool = False
    #: Per message moved: seconds late, less what release control added.
    lateness_seconds: tuple[float, ...] = ()
    #: Messages deferred to their release slots.
    deferred: int = 0
    #: Per message moved to a capped destination: (destination, seconds release control added).
    release_lag: tuple[tuple[str, float], ...] = ()

    def __add__(self, other: MoveReport) -> MoveReport:
        return MoveReport(
            moved=self.moved + other.moved,
            failed_attempts=self.failed_attempts + other.failed_attempts,
            moved_to_error_queue=self.moved_to_error_queue + other.moved_to_error_queue,
            batches=self.batches + other.batches,
            full_batch=other.full_batch,
            exactly_once=self.exactly_once or other.exactly_once,
            lateness_seconds=self.lateness_seconds + other.lateness_seconds,
            deferred=self.deferred + other.deferred,
            release_lag=self.release_lag + other.release_lag,
        )


class _Placer:
    """A ``DelayingTransport`` as the core's ``PlacingTransport``: release control places messages at their slots."""

    def __init__(self, transport: DelayingTransport, max_delay: int) -> None:
        self.transport = transport
        self._max_delay = max_delay

    @property
    def max_delay_seconds(self) -> int:
        """The delaying transport's native cap (``max_native_delay``)."""
        return self._max_delay

    def send(self, message: DelayedMessage) -> None:
        """Send now."""
        self.transport.send_delayed(message, 0)

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        """Send, visible after ``delay_seconds``."""
        self.transport.send_delayed(message, delay_seconds)


class _LookAheadSender:
    """Adapts a ``DelayingTransport`` to ``Transport``: each claimed message gets its remaining delay."""

    def __init__(self, transport: DelayingTransport) -> None:
        self.transport = transport
        self.delays: dict[str, tuple[str, int]] = {}

    def send(self, message: DelayedMessage) -> None:
        destination, delay = self.delays.get(message.message_id, (message.destination, 0))
        self.transport.send_delayed(message, delay if destination == message.destination else 0)


class PostgresBatchMover:
    """Moves due messages from a ``PostgresDelayedMessageStore`` to their destinations, a batch per call."""

    def __init__(
        self,
        store: PostgresDelayedMessageStore,
        transport: Transport | DelayingTransport,
        *,
        settings: DelayedDeliverySettings | None = None,
        batch_size: int | None = None,
        look_ahead: float = 0.0,
        max_native_delay: int = 900,
        exactly_once: bool | None = None,
        schedule: PollSchedule | None = None,
        clock: Clock | None = None,
        on_critical_error: CriticalErrorCallback | None = None,
    ) -> None:
        self.settings = settings or DelayedDeliverySettings()
        self.batch_size = batch_size if batch_size is not None else self.settings.batch_size
        _check_sizes(self.batch_size, max_native_delay, look_ahead)
        #: The delaying transport's longest native delay (SQS: 900 s).
        self.max_native_delay = max_native_delay
        self.store = store
        self.transport = transport
        self.look_ahead = float(look_ahead)
        self.schedule = schedule or PollSchedule(cap=self.settings.max_idle_sleep)
        self.clock = clock or SystemClock()
        same_db = isinstance(transport, PostgresQueueTransport) and same_database(store.conninfo, transport.conninfo)
        rates = self.settings.release_rates
        self.exactly_once = _exactly_once(exactly_once, same_db=same_db, look_ahead=look_ahead, paced=bool(rates))
        self._sender, sending = _sending_transport(transport, look_ahead)
        #: Release control places capped messages at their slots through a delaying transport.
        self._placing = bool(rates) and isinstance(transport, DelayingTransport) and not self.exactly_once
        if self._placing:
            assert isinstance(transport, DelayingTransport)
            sending = _Placer(transport, self.max_native_delay)
        self.dispatcher = Dispatcher(
            store,
            sending,
            self.settings.with_(batch_size=self.batch_size, release_rates=ReleaseRates()),
            clock=self.clock,
            on_critical_error=on_critical_error,
        )
        self._wake = threading.Event()
        #: The schedule every mover of this table shares (None without release rates).
        self.release: SharedReleaseSchedule | None = None
        if rates:
            self.release = SharedReleaseSchedule(store, rates)
            self.release.setup()
        if self.exactly_once:
            assert isinstance(transport, PostgresQueueTransport)
            self._sql_move = move_statement(store, transport)
            self._sql_paced = paced_statements(store, transport)

    # -- one batch -------------------------------------------------------------

    def move_once(self) -> MoveReport:
        """Move up to ``batch_size`` due rows (one transaction when exactly-once)."""
        if self.release is not None:
            report = self._move_paced_once(self.release) if self.exactly_once else self._send_paced(self.release)
        elif self.exactly_once:
            with self.store.cursor() as cur:
                cur.execute(self._sql_move, {"limit": self.batch_size})
                lateness = tuple(max(0.0, float(r[0])) for r in cur.fetchall())
            report = MoveReport(
                moved=len(lateness),
                batches=1 if lateness else 0,
                full_batch=len(lateness) >= self.batch_size,
                exactly_once=True,
                lateness_seconds=lateness,
            )
        else:
            now, batch = self.store.claim_due(self.batch_size, look_ahead=self.look_ahead)
            if not batch:
                return MoveReport()
            if self._sender is not None:
                cap = self.max_native_delay
                self._sender.delays = {
                    m.message_id: (m.destination, native_delay_seconds(m.due_at, now, cap)) for m in batch
                }
            part = self.dispatcher.dispatch_batch(batch, now)
            report = MoveReport(
                moved=part.dispatched,
                failed_attempts=part.failed_attempts,
                moved_to_error_queue=part.moved_to_error_queue,
                batches=1,
                full_batch=len(batch) >= self.batch_size,
                lateness_seconds=tuple(part.lateness_seconds),
            )
        if report.moved or report.deferred:
            _log.info(
                "moved a batch of due messages",
                extra={lf.EVENT: lf.EVENT_FORWARDED, lf.BATCH_SIZE: report.moved},
            )
        return report

    def _move_paced_once(self, release: SharedReleaseSchedule) -> MoveReport:
        """The exactly-once move with release control: plan, defer what waits, move the rest; one transaction."""
        q = self._sql_paced
        with self.store.cursor(transaction=True) as cur:
            cur.execute(q.claim, {"limit": self.batch_size})
            rows = cur.fetchall()
            if not rows:
                return MoveReport(exactly_once=True)
            now = rows[0][4]
            kept = {mid: slot for mid, _, _, slot, _ in rows if slot is not None}
            fresh = [(mid, dest, due) for mid, dest, due, slot, _ in rows if slot is None]
            slots = release.plan(cur, fresh, now)
            later = [(mid, slot) for mid, slot in slots.items() if slot > now]
            if later:
                ids, when = zip(*later, strict=True)
                cur.execute(q.defer, {"ids": list(ids), "slots": list(when)})
            waiting = {mid for mid, _ in later}
            cur.execute(q.move, {"ids": [r[0] for r in rows if r[0] not in waiting]})
            moved = cur.fetchall()
        dues = {mid: due for mid, _, due, _, _ in rows}
        destinations = {mid: dest for mid, dest, _, _, _ in rows}
        # what release control adds is fixed once a slot is booked: reported then, for moved and deferred rows alike
        lags = tuple(
            (destinations[mid], max(0.0, (slot - max(dues[mid], now)).total_seconds())) for mid, slot in slots.items()
        )
        lateness: list[float] = []
        for mid, _, late in moved:
            if mid in kept:  # deferred earlier: late after its slot
                lateness.append(max(0.0, (now - kept[mid]).total_seconds()))
            else:
                lateness.append(max(0.0, float(late)))
        return MoveReport(
            moved=len(moved),
            batches=1,
            full_batch=len(rows) >= self.batch_size,
            exactly_once=True,
            lateness_seconds=tuple(lateness),
            deferred=len(later),
            release_lag=lags,
        )

    def _send_paced(self, release: SharedReleaseSchedule) -> MoveReport:
        """The at-least-once move with release control: claim, plan, send (placed when the transport can delay)."""
        now, batch = self.store.claim_due(self.batch_size)
        if not batch:
            return MoveReport()
        fresh = [(m.message_id, m.destination, m.due_at) for m in batch if slot_of(m) is None]
        with self.store.cursor(transaction=True) as cur:
            slots = release.plan(cur, fresh, now)
        releases: dict[str, Release] = {}
        deferrals: list[tuple[str, datetime, str]] = []
        lags: list[tuple[str, float]] = []
        for m in batch:
            kept = slot_of(m)
            slot = kept if kept is not None else slots.get(m.message_id)
            if slot is None:
                continue  # uncapped: sent as it is
            if kept is None:  # booked now: what release control adds is reported now
                lags.append((m.destination, max(0.0, (slot - max(m.due_at, now)).total_seconds())))
            late = 0.0 if kept is not None else max(0.0, (now - m.due_at).total_seconds())
            delay = math.ceil((slot - now).total_seconds() - 1e-6)
            if delay <= 0:
                releases[m.message_id] = Release(m, 0, slot.timestamp(), None, late)
            elif self._placing and delay <= self.max_native_delay:
                releases[m.message_id] = Release(m, delay, slot.timestamp(), None, late)
            else:
                deferrals.append((m.message_id, slot, claim_of(m) or ""))
        waiting = {mid for mid, _, _ in deferrals}
        if deferrals:
            self.store.defer(deferrals)
        sending = [m for m in batch if m.message_id not in waiting]
        part = self.dispatcher.dispatch_batch(sending, now, releases=releases)
        return MoveReport(
            moved=part.dispatched,
            failed_attempts=part.failed_attempts,
            moved_to_error_queue=part.moved_to_error_queue,
            batches=1,
            full_batch=len(batch) >= self.batch_size,
            lateness_seconds=tuple(part.lateness_seconds),
            deferred=len(deferrals),
            release_lag=tuple(lags),
        )

    def drain(self, budget: float | None = None) -> MoveReport:
        """Move batches until one is not full or ``budget`` seconds pass (a timer-triggered function's run)."""
        deadline = None if budget is None else time.monotonic() + budget
        total = MoveReport()
        while True:
            part = self.move_once()
            total += part
            if not part.full_batch or (deadline is not None and time.monotonic() >= deadline):
                return total

    # -- long-running --------------------------------------------------------------

    def wake(self) -> None:
        """Make a sleeping ``run`` poll at once."""
        self._wake.set()

    def run(self, stop: threading.Event, *, listen: bool = True, budget: float | None = None) -> MoveReport:
        """Poll and move until ``stop`` is set (or ``budget`` seconds pass), waking on the store's NOTIFY."""
        listener: DueListener | None = None
        if listen:
            listener = DueListener(self.store.conninfo, self.store.notify_channel)
            listener.subscribe(lambda _due: self._wake.set())
            listener.start()
        try:
            return self._loop(stop, budget)
        finally:
            if listener is not None:
                listener.stop()

    def _loop(self, stop: threading.Event, budget: float | None) -> MoveReport:
        deadline = None if budget is None else time.monotonic() + budget
        breaker = self.dispatcher.fetch_breaker
        total = MoveReport()
        interval: float | None = None
        while not stop.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._wake.clear()
            try:
                part = self.move_once()
            except Exception as exc:
                breaker.failure(exc)
                _log.warning("moving due messages failed: %r", exc, extra={lf.REASON: repr(exc)})
                self._sleep(stop, breaker.failure_delay, left)
                continue
            breaker.success()
            total += part
            interval = self.schedule.next_interval(interval, part.moved)
            if part.full_batch:
                continue
            try:
                until = self.store.seconds_until_next_due()
            except Exception:
                until = None
            if until is not None:
                until -= self.look_ahead
            self._sleep(stop, self.schedule.sleep_for(interval, until), left)
        return total

    def _sleep(self, stop: threading.Event, seconds: float, left: float | None) -> None:
        """Sleep up to ``seconds`` in short slices, returning early on ``wake`` or ``stop``."""
        if left is not None:
            seconds = min(seconds, max(0.0, left))
        end = time.monotonic() + seconds
        while not stop.is_set():
            remaining = end - time.monotonic()
            if remaining <= 0 or self._wake.wait(min(remaining, 0.25)):
                return


def _check_sizes(batch_size: int, max_native_delay: int, look_ahead: float) -> None:
    """Refuse a batch size, native delay cap or look-ahead out of range."""
    if batch_size < 1:
        raise ConfigurationError("batch_size must be at least 1")
    if not is_whole(max_native_delay, 1):
        raise ConfigurationError(f"max_native_delay must be a whole number of seconds, got {max_native_delay!r}")
    if not 0 <= look_ahead <= max_native_delay:
        raise ConfigurationError(f"look_ahead must be between 0 and max_native_delay ({max_native_delay} s)")


def _exactly_once(asked: bool | None, *, same_db: bool, look_ahead: float, paced: bool) -> bool:
    """Whether moves are exactly once (by default when the queue table shares the store's database), refusing the
    combinations that cannot work: exactly once elsewhere, or look-ahead with exactly once or with release rates."""
    if asked and not same_db:
        raise ConfigurationError("exactly_once needs a PostgresQueueTransport on the store's own database")
    exactly_once = same_db if asked is None else asked
    if exactly_once and look_ahead:
        raise ConfigurationError("look_ahead needs a transport with native delays, not the queue table")
    if paced and look_ahead:
        raise ConfigurationError(
            "look_ahead sends messages before they are due, release control plans them once due: with "
            "release_rates (DELAYED_DELIVERY_RELEASE_RATES) use look_ahead=0 (a transport with native delays "
            "still places each capped message at its slot)"
        )
    return exactly_once


def _sending_transport(
    transport: Transport | DelayingTransport, look_ahead: float
) -> tuple[_LookAheadSender | None, Transport]:
    """The look-ahead wrapper (when ``look_ahead``) and the transport the dispatcher sends with."""
    if look_ahead:
        if not isinstance(transport, DelayingTransport):
            raise ConfigurationError("look_ahead needs a transport with send_delayed(message, delay_seconds)")
        sender = _LookAheadSender(transport)
        return sender, sender
    if isinstance(transport, Transport):
        return None, transport
    raise ConfigurationError(f"{type(transport).__name__} has no send(message)")
