"""The dispatcher: fetch due messages, send each to its destination, then remove it.

Failures are counted per message; past ``number_of_retries`` the message goes to the
error queue with the reason in a header. With ``release_rates`` set, each message leaves at its release slot
(``pacing.py``): capped destinations get at most their rate, and the lag that adds is reported apart from
transport lateness. Store, fetch and dispatch each sit behind a
breaker that raises a critical error after failing continuously for its configured time,
and a rate breaker watches failed deliveries (as NServiceBus's recovery circuit breaker does).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from . import headers as hdr
from . import logfields as lf
from .breaker import FailureRateCircuitBreaker, RepeatedFailuresCircuitBreaker
from .clock import Clock, SystemClock
from .errors import CircuitBreakerTrippedError, DelayedDeliveryDisabledError, InvalidMessageError, PermanentError
from .model import DelayedMessage
from .pacing import Deferral, Pacer, Planned, Release
from .ports import (
    BatchRemovingStore,
    CriticalErrorCallback,
    DeferringStore,
    DelayedMessageStore,
    PlacingTransport,
    ReleaseStateStore,
    ReschedulableStore,
    SharedReleaseState,
    Transport,
    claim_of,
    claimed_until,
)
from .release import ReleasePlanner
from .settings import DelayedDeliverySettings

__all__ = ["DispatchReport", "Dispatcher"]

_log = logging.getLogger("delayed_delivery.dispatcher")

#: With release control, held messages are sent in ticks this long (seconds): sends grouped, at most this late.
PACE_TICK = 0.02
#: A fetched message is not sent once its claim has less than this left (seconds): another dispatcher may fetch it
#: the moment the claim runs out, so sending it then could deliver it twice.
CLAIM_MARGIN = 2.0
#: Pauses when the store says a message is due but its fetch returned none (the store's clock is behind
#: this host's, or rows are claimed elsewhere): retry at once, then 50 ms doubling to 1 s, never spin.
_DISAGREEMENT_FIRST = 0.05
_DISAGREEMENT_MAX = 1.0


@dataclass(slots=True)
class DispatchReport:
    """What one ``dispatch_due`` call did."""

    dispatched: int = 0
    failed_attempts: int = 0
    moved_to_error_queue: int = 0
    already_removed: int = 0
    fetch_failures: int = 0
    batches: int = 0
    #: Per message sent: seconds late on arrival, less what release control added (transport lateness).
    lateness_seconds: list[float] = field(default_factory=list)
    #: Per capped destination: the seconds release control added to each message sent there.
    release_lag_seconds: dict[str, list[float]] = field(default_factory=dict)
    #: Per capped destination: the release slot (epoch seconds: when it becomes visible) of each message sent there.
    release_slots: dict[str, list[float]] = field(default_factory=dict)
    #: Messages given back to the store until their release slot.
    deferred: int = 0
    #: Fetched messages not sent because their claims had run out (their rows are fetched again).
    claims_ran_out: int = 0

    def merge(self, other: DispatchReport) -> None:
        """Add ``other``'s counts to this report."""
        self.dispatched += other.dispatched
        self.failed_attempts += other.failed_attempts
        self.moved_to_error_queue += other.moved_to_error_queue
        self.already_removed += other.already_removed
        self.fetch_failures += other.fetch_failures
        self.batches += other.batches
        self.lateness_seconds.extend(other.lateness_seconds)
        for destination, lags in other.release_lag_seconds.items():
            self.release_lag_seconds.setdefault(destination, []).extend(lags)
        for destination, slots in other.release_slots.items():
            self.release_slots.setdefault(destination, []).extend(slots)
        self.deferred += other.deferred
        self.claims_ran_out += other.claims_ran_out


def _log_critical(error: CircuitBreakerTrippedError) -> None:
    _log.critical("critical error: %s", error, extra={lf.BREAKER: error.breaker})


class Dispatcher:
    """Moves due messages from a store to their destinations."""

    def __init__(
        self,
        store: DelayedMessageStore,
        transport: Transport,
        settings: DelayedDeliverySettings | None = None,
        *,
        clock: Clock | None = None,
        on_critical_error: CriticalErrorCallback | None = None,
        overlap_removal: bool = False,
        release_share: float = 1.0,
        release_state: ReleaseStateStore | None = None,
        log_fields: Mapping[str, str] | None = None,
    ) -> None:
        # overlap_removal: with a batch-removing store, remove each sent batch in the background while the next
        # batch is fetched and sent (the store must not hand out a row again before its removal has finished)
        # release_share: this dispatcher's share of each release rate (1/N for one of N dispatchers or shards)
        # release_state: where the release schedule is kept between runs (loaded on the first paced run, saved
        # before what a batch booked more than a second ahead is sent, and at each run's end)
        self.store_port = store
        self.transport = transport
        self.settings = settings or DelayedDeliverySettings()
        self.clock = clock or SystemClock()
        # log_fields (e.g. {"cloud": "azure"}) go on every message's log line, so the logs say where they came from
        self._log_fields = dict(log_fields or {})
        self._critical = on_critical_error or _log_critical
        s = self.settings
        delays = {"armed_delay": s.failure_delay, "tripped_delay": s.tripped_failure_delay}
        self.store_breaker = RepeatedFailuresCircuitBreaker(
            "store", s.time_to_trigger_store_circuit_breaker, self.clock, self._critical, **delays
        )
        self.fetch_breaker = RepeatedFailuresCircuitBreaker(
            "fetch", s.time_to_trigger_fetch_circuit_breaker, self.clock, self._critical, **delays
        )
        self.dispatch_breaker = RepeatedFailuresCircuitBreaker(
            "dispatch", s.time_to_trigger_dispatch_circuit_breaker, self.clock, self._critical, **delays
        )
        self.recovery_breaker = FailureRateCircuitBreaker(
            "recovery",
            s.maximum_recovery_failures_per_second,
            s.time_to_trigger_dispatch_circuit_breaker,
            self.clock,
            self._critical,
        )
        self._wakeup = threading.Event()
        self._next_due: datetime | None = None
        self._disagreements = 0  # empty fetches in a row while the store said something was due
        self._pool = ThreadPoolExecutor(s.max_concurrency) if s.max_concurrency > 1 else None
        overlap = overlap_removal and isinstance(store, BatchRemovingStore)
        self._settler = ThreadPoolExecutor(1, thread_name_prefix="settle") if overlap else None
        self._settling: Future[DispatchReport] | None = None
        self._settled = DispatchReport()
        #: Release control (None without ``release_rates``): the slots and what waits for them.
        self.pacer: Pacer | None = None
        if s.release_rates:
            self.pacer = Pacer(ReleasePlanner(s.release_rates, share=release_share), transport, store)
        self.release_state = release_state
        self._state_loaded = False
        self._saved: dict[str, float] = {}

    # -- ingress ---------------------------------------------------------

    def store(self, message: DelayedMessage) -> None:
        """Store ``message`` through the store breaker and wake the loop if it is due sooner than known."""
        try:
            self.store_port.store(message)
        except InvalidMessageError:
            raise  # the caller's message (e.g. an id already pending with other content), not the store failing
        except Exception as exc:
            self.store_breaker.failure(exc)
            raise
        self.store_breaker.success()
        self.notify(message.due_at)

    def notify(self, due_at: datetime) -> None:
        """Tell the loop a message due at ``due_at`` exists (e.g. stored by another process)."""
        if self._next_due is None or due_at < self._next_due:
            self._next_due = due_at
            self._wakeup.set()

    # -- one-shot --------------------------------------------------------

    def dispatch_due(
        self,
        budget: float | None = None,
        *,
        wait_for_due: bool = False,
        keep_going: Callable[[], bool] | None = None,
    ) -> DispatchReport:
        """Dispatch until nothing is due or ``budget`` seconds have passed (see ``_dispatch_due``).

        Returns only once every sent message's removal has finished.
        """
        try:
            report = self._dispatch_due(budget, wait_for_due=wait_for_due, keep_going=keep_going)
        finally:
            self._finish_settling()
        report.merge(self._settled)
        self._settled = DispatchReport()
        return report

    def _dispatch_due(
        self,
        budget: float | None = None,
        *,
        wait_for_due: bool = False,
        keep_going: Callable[[], bool] | None = None,
    ) -> DispatchReport:
        """Dispatch until nothing is due or ``budget`` seconds have passed.

        With ``wait_for_due`` the call sleeps until the next due message instead of
        returning when idle, so a timer-triggered function can keep lateness near one
        poll for its whole run. ``keep_going`` is asked before every fetch and every
        send; when it returns False (e.g. a lease was lost) the call stops at once and
        unsent claimed messages are left for their claims to expire.
        """
        report = DispatchReport()
        if not self.settings.enabled:
            return report
        if self.pacer is not None:
            return self._dispatch_paced(self.pacer, budget, wait_for_due=wait_for_due, keep_going=keep_going)
        start = self.clock.now()
        deadline = start + timedelta(seconds=budget) if budget is not None else None
        while True:
            now = self.clock.now()
            if deadline is not None and now >= deadline:
                return report
            if keep_going is not None and not keep_going():
                return report
            try:
                batch = self.store_port.fetch_due(now, self.settings.batch_size)
            except Exception as exc:
                report.fetch_failures += 1
                self.fetch_breaker.failure(exc)
                _log.warning("fetching due messages failed: %r", exc, extra={lf.REASON: repr(exc)})
                self.clock.sleep(self._bounded(self.fetch_breaker.failure_delay, deadline))
                continue
            self.fetch_breaker.success()
            if batch:
                self._disagreements = 0
                report.batches += 1
                try:
                    part = self.dispatch_batch(batch, now, keep_going)
                except Exception as exc:
                    # settling failed (store down after the sends): unsettled claims expire and are sent again
                    self.store_breaker.failure(exc)
                    _log.warning("settling a dispatched batch failed: %r", exc, extra={lf.REASON: repr(exc)})
                    self.clock.sleep(self._bounded(self.store_breaker.failure_delay, deadline))
                    continue
                self.store_breaker.success()
                report.merge(part)
                if part.failed_attempts and not part.dispatched:
                    # every send in the batch failed: pause as NServiceBus does (1 s armed, 10 s tripped)
                    self.clock.sleep(self._bounded(self.dispatch_breaker.failure_delay, deadline))
                continue
            if not wait_for_due:
                return report
            self._sleep_until_next_due(deadline)

    def dispatch_batch(
        self,
        batch: Sequence[DelayedMessage],
        now: datetime,
        keep_going: Callable[[], bool] | None = None,
        releases: Mapping[str, Release] | None = None,
    ) -> DispatchReport:
        """Send a claimed batch (concurrently when ``max_concurrency`` > 1) and settle each message.

        Stores that implement ``remove_many`` get one removal call for the whole batch. ``releases`` (by message
        id, from release pacing): the delay each is sent with and the release lag it carries.
        """
        batched = isinstance(self.store_port, BatchRemovingStore)
        sent: list[tuple[DelayedMessage, float, float | None]] = []
        sent_lock = threading.Lock()

        def one(message: DelayedMessage) -> DispatchReport:
            if keep_going is not None and not keep_going():
                return DispatchReport()
            if self._claim_ran_out(message):
                return DispatchReport(claims_ran_out=1)
            release = releases.get(message.message_id) if releases is not None else None
            part = self._dispatch_one(message, now, remove=not batched, release=release)
            if batched and part.dispatched:
                with sent_lock:
                    sent.append((message, part.lateness_seconds[-1], release.lag if release is not None else None))
            return part

        sequential = self._pool is None or len(batch) == 1
        parts = [one(m) for m in batch] if sequential or self._pool is None else list(self._pool.map(one, batch))
        total = DispatchReport()
        for part in parts:
            total.merge(part)
        if batched and self._settler is not None:
            error: Exception | None = None
            try:  # the previous batch's removal, which ran while this batch was fetched and sent
                total.merge(self._wait_settling())
            except Exception as exc:
                error = exc
            if sent:
                self._settling = self._settler.submit(self._settle, sent)
            if error is not None:
                raise error
            return total
        if batched and sent:
            assert isinstance(self.store_port, BatchRemovingStore)
            total.merge(self._settle(sent))
        return total

    def _dispatch_paced(
        self,
        pacer: Pacer,
        budget: float | None,
        *,
        wait_for_due: bool,
        keep_going: Callable[[], bool] | None,
        stop: threading.Event | None = None,
    ) -> DispatchReport:
        """``_dispatch_due`` with release control: every message leaves at its slot (``pacing.py``).

        Fetches reach ``pacer.lookahead`` ahead when waiting for due messages, so slots a second apart are fetched
        together, and the store is asked again only when something there can be fetched (or after the idle cap);
        held messages are sent in ticks of ``PACE_TICK``. Whatever is still held when the call ends is placed,
        deferred to the store, or let go (lost ``keep_going``: nothing is sent then).
        """
        report = DispatchReport()
        deadline = self.clock.now() + timedelta(seconds=budget) if budget is not None else None
        ahead = timedelta(seconds=pacer.lookahead if wait_for_due else 0.0)
        may_send = True
        self._load_release_state(pacer)
        poll_at: datetime | None = None  # None: fetch at once
        try:
            while stop is None or not stop.is_set():
                now = self.clock.now()
                if deadline is not None and now >= deadline:
                    break
                if keep_going is not None and not keep_going():
                    may_send = False
                    break
                ready = pacer.due(now)
                if ready:
                    self._send_released(ready, now, keep_going, report, deadline)
                    continue
                if pacer.has_room() and (poll_at is None or now >= poll_at or self._wakeup.is_set()):
                    self._wakeup.clear()
                    try:
                        batch = self.store_port.fetch_due(now + ahead, self.settings.batch_size)
                    except Exception as exc:
                        report.fetch_failures += 1
                        self.fetch_breaker.failure(exc)
                        _log.warning("fetching due messages failed: %r", exc, extra={lf.REASON: repr(exc)})
                        self.clock.sleep(self._bounded(self.fetch_breaker.failure_delay, deadline))
                        continue
                    self.fetch_breaker.success()
                    if batch:
                        self._disagreements = 0
                        report.batches += 1
                        deferrals = self._take(pacer, batch, now)
                        report.deferred += self._defer(deferrals, report)
                        poll_at = None
                        continue
                    if not wait_for_due:
                        break  # nothing more is due: what waits for a later slot is placed or deferred below
                    # rows come into the look-ahead one slot at a time: fetch them half a look-ahead at a time
                    poll_at = max(self._next_poll(now + ahead) - ahead, now + ahead / 2)
                if not wait_for_due and not pacer.has_room():
                    pass  # full in a one-shot run: wait for sends to free room
                elif not wait_for_due:
                    break
                wake = poll_at if pacer.has_room() and poll_at is not None else None
                held = pacer.next_at()
                if held is not None:
                    held = max(held, now + timedelta(seconds=PACE_TICK))
                    wake = held if wake is None else min(wake, held)
                seconds = self.settings.max_idle_sleep if wake is None else (wake - now).total_seconds()
                self._finish_settling()
                self.clock.wait(self._wakeup, self._bounded(max(0.0, seconds), deadline))
        finally:
            sends, deferrals = pacer.drain(self.clock.now(), may_send=may_send)
            if sends:
                self._send_released(sends, self.clock.now(), keep_going, report, deadline)
            report.deferred += self._defer(deferrals, report)
            if may_send:
                self._save_release_state(pacer, self.clock.now(), force=True)
        return report

    def _take(self, pacer: Pacer, batch: Sequence[DelayedMessage], now: datetime) -> list[Deferral]:
        """Book slots for a fetched batch and hold it; what the batch booked is saved before any of it is sent.

        With a shared schedule (``SharedReleaseState``: every shard of a table books from one) a batch with a capped
        message books there, after whatever the others booked, so each cap is shared by what each dispatcher has
        due. If no booking sticks (storage down) the batch keeps the slots of its last attempt (logged): other
        dispatchers may overlap them for a while; nothing is lost or sent before it is due.
        """
        shared = self.release_state if isinstance(self.release_state, SharedReleaseState) else None
        if shared is None or not any(pacer.planner.rate_for(m.destination) is not None for m in batch):
            deferrals = pacer.take(batch, now)
            self._save_release_state(pacer, now)
            return deferrals
        before = pacer.planner.snapshot()
        planned: list[Planned] = []

        def plan(latest: Mapping[str, float]) -> Mapping[str, float]:
            pacer.planner.restore(before)
            pacer.planner.load(latest)
            planned[:] = pacer.plan(batch, now)
            pacer.planner.forget_before(now.timestamp())
            return pacer.planner.state()

        try:
            shared.book(plan)
            self._saved = pacer.planner.state()
        except Exception as exc:
            _log.warning("booking release slots in the shared schedule failed: %r", exc, extra={lf.REASON: repr(exc)})
            if not planned:
                pacer.planner.restore(before)
                planned = pacer.plan(batch, now)
        return pacer.hold(planned, now)

    def _load_release_state(self, pacer: Pacer) -> None:
        """Continue the schedule the last run (or the last holder of these rows) saved, once per dispatcher."""
        if self.release_state is None or self._state_loaded:
            return
        try:
            saved = self.release_state.load()
        except Exception as exc:  # start from now: slots may overlap what the last run placed, nothing is lost
            _log.warning("reading the saved release schedule failed: %r", exc, extra={lf.REASON: repr(exc)})
            return
        pacer.planner.load(saved)
        self._saved = dict(saved)
        self._state_loaded = True

    def _save_release_state(self, pacer: Pacer, now: datetime, *, force: bool = False) -> None:
        """Save the schedule when it booked more than a second ahead beyond what was saved (or at a run's end)."""
        if self.release_state is None:
            return
        pacer.planner.forget_before(now.timestamp())  # a schedule free by now matters no more
        state = pacer.planner.state()
        horizon = now.timestamp() + 1.0
        ahead = any(v > horizon and v > self._saved.get(d, 0.0) for d, v in state.items())
        if not (ahead or (force and state != self._saved)):
            return
        try:
            self.release_state.save(state)
        except Exception as exc:  # the next holder may overlap these slots for a while; nothing is lost
            _log.warning("saving the release schedule failed: %r", exc, extra={lf.REASON: repr(exc)})
            return
        self._saved = state

    def _next_poll(self, now: datetime) -> datetime:
        """After an empty fetch at ``now``: when the store may have something to fetch (backing off while the store
        says something is due that a fetch does not return), at most ``max_idle_sleep`` away."""
        self._finish_settling()  # before asking for the next due row: it must not be one being removed
        try:
            next_due = self.store_port.next_due()
            self.fetch_breaker.success()
        except Exception as exc:
            self.fetch_breaker.failure(exc)
            return now + timedelta(seconds=self.fetch_breaker.failure_delay)
        self._next_due = next_due
        idle = now + timedelta(seconds=self.settings.max_idle_sleep)
        if next_due is None:
            self._disagreements = 0
            return idle
        if next_due > now:
            self._disagreements = 0
            return min(idle, next_due)
        backoff = 0.0
        if self._disagreements:
            backoff = min(
                self.settings.max_idle_sleep,
                _DISAGREEMENT_MAX,
                _DISAGREEMENT_FIRST * 2 ** min(self._disagreements - 1, 10),
            )
        self._disagreements += 1
        return now + timedelta(seconds=backoff)

    def _send_released(
        self,
        released: Sequence[Release],
        now: datetime,
        keep_going: Callable[[], bool] | None,
        report: DispatchReport,
        deadline: datetime | None,
    ) -> None:
        """Send what the pacer released (each with its delay), in batches of ``batch_size``, and settle them."""
        size = self.settings.batch_size
        for start in range(0, len(released), size):
            chunk = released[start : start + size]
            messages = [r.message for r in chunk]
            try:
                part = self.dispatch_batch(messages, now, keep_going, {r.message.message_id: r for r in chunk})
            except Exception as exc:
                # settling failed (store down after the sends): unsettled claims expire and are sent again
                self.store_breaker.failure(exc)
                _log.warning("settling a dispatched batch failed: %r", exc, extra={lf.REASON: repr(exc)})
                self.clock.sleep(self._bounded(self.store_breaker.failure_delay, deadline))
                continue
            self.store_breaker.success()
            report.merge(part)

    def _defer(self, deferrals: Sequence[Deferral], report: DispatchReport) -> int:
        """Give messages back to the store until their slots; how many it took (the rest keep their claims)."""
        if not deferrals or not isinstance(self.store_port, DeferringStore):
            return 0
        items = [(d.message.message_id, d.slot, claim_of(d.message) or "") for d in deferrals]
        try:
            kept = self.store_port.defer(items)
        except Exception as exc:
            # the claims stay and expire: the rows are fetched again and planned again (late, never lost)
            self.store_breaker.failure(exc)
            _log.warning("deferring messages to their release slots failed: %r", exc, extra={lf.REASON: repr(exc)})
            return 0
        self.store_breaker.success()
        for deferral, done in zip(deferrals, kept, strict=True):
            if done and deferral.lag is not None:  # its slot is fixed now: so is what release control adds
                report.release_lag_seconds.setdefault(deferral.message.destination, []).append(deferral.lag)
        return sum(1 for k in kept if k)

    # -- long-running ----------------------------------------------------

    def run(self, stop: threading.Event) -> DispatchReport:
        """Dispatch until ``stop`` is set, sleeping until the next due message in between."""
        if self.pacer is not None and self.settings.enabled:
            try:
                return self._dispatch_paced(self.pacer, None, wait_for_due=True, keep_going=None, stop=stop)
            finally:
                self._finish_settling()
        report = DispatchReport()
        while not stop.is_set():
            report.merge(self.dispatch_due())
            if stop.is_set():
                break
            self._sleep_until_next_due(None, stop)
        return report

    def close(self) -> None:
        """Release the worker threads."""
        self._finish_settling()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._settler is not None:
            self._settler.shutdown(wait=True)

    def _settle(self, sent: list[tuple[DelayedMessage, float, float | None]]) -> DispatchReport:
        """Remove sent messages in one ``remove_many`` call and log each outcome."""
        assert isinstance(self.store_port, BatchRemovingStore)
        report = DispatchReport()
        ids = [m.message_id for m, _, _ in sent]
        claims = [claim_of(m) for m, _, _ in sent]
        if any(c is not None for c in claims):
            flags = self.store_port.remove_many(ids, claims)
        else:  # a store without claim tokens (its remove_many may not take them)
            flags = self.store_port.remove_many(ids)
        for (message, lateness, lag), removed in zip(sent, flags, strict=True):
            report.already_removed += self._log_removal(message, lateness, removed, lag)
        return report

    def _wait_settling(self) -> DispatchReport:
        """Wait for the background removal, if any; its report (or its exception)."""
        pending, self._settling = self._settling, None
        return DispatchReport() if pending is None else pending.result()

    def _finish_settling(self) -> None:
        """Wait for the background removal and keep its report; a failure trips the store breaker, as inline."""
        try:
            self._settled.merge(self._wait_settling())
        except Exception as exc:
            # unsettled rows keep their claims, which expire: they are sent again (a duplicate, never a loss)
            self.store_breaker.failure(exc)
            _log.warning("settling a dispatched batch failed: %r", exc, extra={lf.REASON: repr(exc)})

    # -- internals -------------------------------------------------------

    def _sleep_until_next_due(self, deadline: datetime | None, stop: threading.Event | None = None) -> None:
        self._finish_settling()  # before asking for the next due row: it must not be one being removed
        now = self.clock.now()
        try:
            next_due = self.store_port.next_due()
            self.fetch_breaker.success()
        except Exception as exc:
            self.fetch_breaker.failure(exc)
            next_due = now + timedelta(seconds=self.fetch_breaker.failure_delay)
        self._wakeup.clear()
        self._next_due = next_due
        wait = self.settings.max_idle_sleep
        if next_due is not None:
            wait = min(wait, max(0.0, (next_due - now).total_seconds()))
        if next_due is not None and next_due <= now:  # due, yet the fetch that led here returned nothing
            if self._disagreements:
                backoff = _DISAGREEMENT_FIRST * 2 ** min(self._disagreements - 1, 10)
                wait = min(self.settings.max_idle_sleep, _DISAGREEMENT_MAX, backoff)
            self._disagreements += 1
        else:
            self._disagreements = 0
        wait = self._bounded(wait, deadline)
        if stop is not None and stop.is_set():
            return
        self.clock.wait(self._wakeup, wait)

    def _bounded(self, seconds: float, deadline: datetime | None) -> float:
        if deadline is None:
            return seconds
        return max(0.0, min(seconds, (deadline - self.clock.now()).total_seconds()))

    def _dispatch_one(
        self, message: DelayedMessage, now: datetime, *, remove: bool = True, release: Release | None = None
    ) -> DispatchReport:
        report = DispatchReport()
        delay = release.delay if release is not None else 0
        lag = release.lag if release is not None else None
        try:
            if hdr.UNREADABLE in message.headers:  # a store row that could not be read: never to its destination
                raise PermanentError(f"unreadable store row: {message.headers[hdr.UNREADABLE]}")
            if delay > 0:
                assert isinstance(self.transport, PlacingTransport)  # the pacer places only on such transports
                self.transport.send_delayed(message, delay)
            else:
                self.transport.send(message)
        except Exception as exc:
            report.failed_attempts += 1
            self._on_send_failure(message, exc, report)
            return report
        self.dispatch_breaker.success()
        arrival = now.timestamp() + delay
        due = message.due_at.timestamp()
        lateness = release.lateness(arrival) if release is not None else max(0.0, arrival - due)
        report.lateness_seconds.append(lateness)
        if lag is not None:
            report.release_lag_seconds.setdefault(message.destination, []).append(lag)
        if release is not None and release.slot is not None and self._capped(message.destination):
            report.release_slots.setdefault(message.destination, []).append(release.slot)
        report.dispatched += 1
        if remove:
            report.already_removed += self._log_removal(message, lateness, self._remove(message), lag)
        return report

    def _claim_ran_out(self, message: DelayedMessage) -> bool:
        """Whether ``message``'s claim has less than ``CLAIM_MARGIN`` left (logged): then it is not sent."""
        until = claimed_until(message)
        if until is None or self.clock.now() < until - timedelta(seconds=CLAIM_MARGIN):
            return False
        _log.warning(
            "not sent: its claim ran out before its turn (a slow batch); its row is fetched again",
            extra={**self._about(message), lf.EVENT: lf.EVENT_CLAIM_RAN_OUT},
        )
        return True

    def _capped(self, destination: str) -> bool:
        """Whether ``release_rates`` caps ``destination``."""
        return self.settings.release_rates.rate_for(destination) is not None

    def _about(self, message: DelayedMessage) -> dict[str, object]:
        """The keys of every log line about ``message``: its id, destination and due time, and ``log_fields``."""
        return {
            **self._log_fields,
            lf.MESSAGE_ID: message.message_id,
            lf.DESTINATION: message.destination,
            lf.DUE_AT: message.due_at.isoformat(),
        }

    def _remove(self, message: DelayedMessage) -> bool:
        """Remove a fetched message under its claim (stores without claim tokens: by id, as they always did)."""
        claim = claim_of(message)
        if claim is None:
            return self.store_port.remove(message.message_id)
        return self.store_port.remove(message.message_id, claim)

    def _log_removal(self, message: DelayedMessage, lateness: float, removed: bool, lag: float | None = None) -> int:
        """Log the outcome of removing a dispatched message; 1 when it was already gone or superseded."""
        base = self._about(message)
        if removed:
            extra = {**base, lf.EVENT: lf.EVENT_DISPATCHED, lf.LATENESS_S: round(lateness, 3)}
            if lag is not None:
                extra[lf.RELEASE_LAG_S] = round(lag, 3)
            _log.info("dispatched", extra=extra)
            return 0
        if claim_of(message) is not None:
            _log.warning(
                "dispatched a message whose claim was superseded (its claim expired and the row was claimed again,"
                " removed or rescheduled): possible duplicate; the row is left as it is",
                extra={**base, lf.EVENT: lf.EVENT_SUPERSEDED},
            )
            return 1
        _log.warning(
            "dispatched a message that another dispatcher had already removed (possible duplicate)",
            extra={**base, lf.EVENT: lf.EVENT_DUPLICATE},
        )
        return 1

    def _on_send_failure(self, message: DelayedMessage, exc: Exception, report: DispatchReport) -> None:
        base = {**self._about(message), lf.REASON: repr(exc)}
        permanent = isinstance(exc, PermanentError)
        if not permanent:
            self.dispatch_breaker.failure(exc)
        self.recovery_breaker.record(exc)
        claim = claim_of(message)
        counted = (
            self.store_port.increment_failure_count(message.message_id)
            if claim is None
            else self.store_port.increment_failure_count(message.message_id, claim)
        )
        if not counted:  # gone, or superseded: whoever holds the row now settles it
            return
        failures = message.failure_count + 1
        if permanent or failures > self.settings.number_of_retries:
            if self._move_to_error_queue(message, exc, failures):
                report.moved_to_error_queue += 1
            return
        _log.warning(
            "delivery failed; will retry",
            extra={**base, lf.EVENT: lf.EVENT_RETRY, lf.FAILURE_COUNT: failures},
        )
        self._back_off(message, failures)

    def _back_off(self, message: DelayedMessage, failures: int) -> None:
        """Push a failed message's due time forward (under its claim) so it cannot block the head of the store."""
        if isinstance(self.store_port, ReschedulableStore):
            backoff = min(self.settings.max_retry_backoff, self.settings.retry_backoff * 2 ** (failures - 1))
            due = self.clock.now() + timedelta(seconds=backoff)
            claim = claim_of(message)
            if claim is None:
                self.store_port.reschedule(message.message_id, due)
            else:
                self.store_port.reschedule(message.message_id, due, claim)

    def _move_to_error_queue(self, message: DelayedMessage, exc: Exception, failures: int) -> bool:
        error_queue = self.settings.error_queue
        failed = message.redirected(error_queue).with_headers(
            {
                hdr.FAILURE_REASON: f"{type(exc).__name__}: {exc}"[:1024],
                hdr.ORIGINAL_DESTINATION: message.destination,
                hdr.FAILED_AT: self.clock.now().isoformat(),
                hdr.FAILURE_COUNT: str(failures),
            }
        )
        base = {**self._about(message), lf.REASON: repr(exc)}
        try:
            self.transport.send(failed)
        except Exception as forward_exc:
            _log.error(
                "could not move message to the error queue; it stays in the store",
                extra={**base, lf.EVENT: lf.EVENT_RETRY, "error_queue_reason": repr(forward_exc)},
            )
            self._back_off(message, failures)
            return False
        self._remove(message)
        _log.error(
            "moved to the error queue",
            extra={**base, lf.EVENT: lf.EVENT_ERROR_QUEUE, lf.FAILURE_COUNT: failures},
        )
        return True


def ensure_enabled(settings: DelayedDeliverySettings) -> None:
    """Raise ``DelayedDeliveryDisabledError`` when the settings switch delayed delivery off."""
    if not settings.enabled:
        raise DelayedDeliveryDisabledError(
            "delayed delivery is disabled (DELAYED_DELIVERY_ENABLED=false): only native delays are allowed"
        )
