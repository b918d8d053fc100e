"""The dispatcher: fetch due messages, send each to its destination, then remove it.

One loop: every fetched batch goes through the pacer (``pacing.py``), which releases it at once without
``release_rates`` and otherwise at each message's release slot (capped destinations get at most their rate, and the
lag that adds is reported apart from transport lateness). What becomes of each message (removed, retried, or past
``number_of_retries`` moved to the error queue with the reason in a header) is ``outcomes.py``; removing a sent
batch (inline or in the background) ``settling.py``; one call's bounds ``dispatch_run.py``. Store, fetch and
dispatch each sit behind a breaker that raises a critical error after failing continuously for its configured time,
and a rate breaker watches failed deliveries (as NServiceBus's recovery circuit breaker does).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from . import logfields as lf
from .breaker import FailureRateCircuitBreaker, RepeatedFailuresCircuitBreaker
from .clock import Clock, SystemClock
from .dispatch_run import DispatchRun
from .errors import CircuitBreakerTrippedError, DelayedDeliveryDisabledError, InvalidMessageError
from .model import DelayedMessage
from .outcomes import DispatchReport, Outcomes
from .pacing import Deferral, Pacer, Release
from .ports import (
    BatchRemovingStore,
    CriticalErrorCallback,
    DeferringStore,
    DelayedMessageStore,
    ReleaseStateStore,
    Transport,
    claim_of,
)
from .release import ReleasePlanner
from .settings import DelayedDeliverySettings
from .settling import Sent, Settler

__all__ = ["DispatchReport", "Dispatcher"]

_log = logging.getLogger("delayed_delivery.dispatcher")

#: With release control, held messages are sent in ticks this long (seconds): sends grouped, at most this late.
PACE_TICK = 0.02
#: Pauses when the store says a message is due but its fetch returned none (the store's clock is behind
#: this host's, or rows are claimed elsewhere): retry at once, then 50 ms doubling to 1 s, never spin.
_DISAGREEMENT_FIRST = 0.05
_DISAGREEMENT_MAX = 1.0


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
        # release_state: where the release schedule is kept between runs (the pacer loads and saves it)
        self.store_port = store
        self.transport = transport
        self.settings = settings or DelayedDeliverySettings()
        self.clock = clock or SystemClock()
        self._critical = on_critical_error or _log_critical
        s = self.settings
        self.store_breaker = self._breaker("store", s.time_to_trigger_store_circuit_breaker)
        self.fetch_breaker = self._breaker("fetch", s.time_to_trigger_fetch_circuit_breaker)
        self.dispatch_breaker = self._breaker("dispatch", s.time_to_trigger_dispatch_circuit_breaker)
        self.recovery_breaker = FailureRateCircuitBreaker(
            "recovery",
            s.maximum_recovery_failures_per_second,
            s.time_to_trigger_dispatch_circuit_breaker,
            self.clock,
            self._critical,
        )
        self.outcomes = Outcomes(
            store, transport, s, self.clock, (self.dispatch_breaker, self.recovery_breaker), log_fields or {}
        )
        self._wakeup = threading.Event()
        self._next_due: datetime | None = None
        self._disagreements = 0  # empty fetches in a row while the store said something was due
        self._per_message = 0.0  # measured seconds per message sent (moving average; 0 until a batch is measured)
        self._pool = ThreadPoolExecutor(s.max_concurrency) if s.max_concurrency > 1 else None
        overlap = overlap_removal and isinstance(store, BatchRemovingStore)
        self._settler = Settler(self.outcomes, self.store_breaker, background=overlap)
        # the one loop runs through a pacer: without release_rates it releases every fetched message at once
        self._pacer = Pacer(ReleasePlanner(s.release_rates, share=release_share), transport, store, state=release_state)

    def _breaker(self, name: str, time_to_trigger: float) -> RepeatedFailuresCircuitBreaker:
        """A breaker that raises a critical error after failing for ``time_to_trigger`` seconds in a row."""
        s = self.settings
        return RepeatedFailuresCircuitBreaker(
            name,
            time_to_trigger,
            self.clock,
            self._critical,
            armed_delay=s.failure_delay,
            tripped_delay=s.tripped_failure_delay,
        )

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

    @property
    def pacer(self) -> Pacer | None:
        """Release control (None without ``release_rates``): the slots and what waits for them."""
        return self._pacer if self._pacer.paced else None

    def dispatch_due(
        self,
        budget: float | None = None,
        *,
        wait_for_due: bool = False,
        keep_going: Callable[[], bool] | None = None,
        within_budget: bool = False,
    ) -> DispatchReport:
        """Dispatch until nothing is due or ``budget`` seconds have passed.

        With ``within_budget`` the budget bounds the last batch too: a fetch takes no more messages than the time
        left covers (at the time per message measured so far), and no send starts after it ends (claimed messages
        not sent are left claimed: the caller releases them).

        With ``wait_for_due`` the call sleeps until the next due message instead of
        returning when idle, so a timer-triggered function can keep lateness near one
        poll for its whole run. ``keep_going`` is asked before every fetch and every
        send; when it returns False (e.g. a lease was lost) the call stops at once and
        unsent claimed messages are left for their claims to expire.
        Returns only once every sent message's removal has finished.
        """
        return self._then_settle(
            lambda: self._loop(budget, wait_for_due=wait_for_due, keep_going=keep_going, within=within_budget)
        )

    @property
    def seconds_per_message(self) -> float:
        """The measured time per message (0 before any batch): a host carries it from one run's dispatcher to the
        next, so only its first run fetches a full batch unmeasured."""
        return self._per_message

    @seconds_per_message.setter
    def seconds_per_message(self, seconds: float) -> None:
        self._per_message = max(0.0, seconds)

    def _fetch_limit(self, now: datetime, run: DispatchRun) -> int:
        """How many messages the next fetch may take: a batch, or (within the budget) what the time left covers."""
        return run.fetch_limit(now, self.settings.batch_size, self._per_message)

    def _then_settle(self, loop: Callable[[], DispatchReport]) -> DispatchReport:
        """``loop()`` (when enabled), then every removal finished and its report merged in."""
        try:
            report = loop() if self.settings.enabled else DispatchReport()
        finally:
            self._settler.finish()
        report.merge(self._settler.collect())
        return report

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
        sent: list[Sent] = []
        sent_lock = threading.Lock()

        def one(message: DelayedMessage) -> DispatchReport:
            if keep_going is not None and not keep_going():
                return DispatchReport()
            if self.outcomes.claim_ran_out(message):
                return DispatchReport(claims_ran_out=1)
            release = releases.get(message.message_id) if releases is not None else None
            part = self.outcomes.send(message, now, remove=not batched, release=release)
            if batched and part.dispatched:
                with sent_lock:
                    sent.append((message, part.lateness_seconds[-1], release.lag if release is not None else None))
            return part

        sequential = self._pool is None or len(batch) == 1
        parts = [one(m) for m in batch] if sequential or self._pool is None else list(self._pool.map(one, batch))
        total = DispatchReport()
        for part in parts:
            total.merge(part)
        if batched:
            total.merge(self._settler.settle(sent))
        return total

    def _loop(
        self,
        budget: float | None,
        *,
        wait_for_due: bool,
        keep_going: Callable[[], bool] | None,
        stop: threading.Event | None = None,
        within: bool = False,
    ) -> DispatchReport:
        """The one dispatch loop: every fetched message goes through the pacer, which releases it at its slot.

        Without caps the slot is the fetch. With caps (``pacing.py``) fetches reach ``pacer.lookahead`` ahead when
        waiting for due messages, so slots a second apart are fetched together, and the store is asked again only
        when something there can be fetched (or after the idle cap); held messages are sent in ticks of
        ``PACE_TICK``. Whatever is still held when the call ends is placed, deferred to the store, or let go (lost
        ``keep_going``: nothing is sent then).
        """
        deadline = self.clock.now() + timedelta(seconds=budget) if budget is not None else None
        ahead = timedelta(seconds=self._pacer.lookahead if wait_for_due else 0.0)
        run = DispatchRun(DispatchReport(), deadline, keep_going, wait_for_due, ahead, within=within)
        self._pacer.load_state()
        try:
            while (stop is None or not stop.is_set()) and self._turn(run):
                pass
        finally:
            self._end_run(run)
        return run.report

    def _turn(self, run: DispatchRun) -> bool:
        """One turn of the loop: send what is released, else fetch, else wait; False when the run is over."""
        now = self.clock.now()
        if run.deadline is not None and now >= run.deadline:
            return False
        if self._fetch_limit(now, run) == 0:
            return False  # the time left cannot cover one more message
        if run.keep_going is not None and not run.keep_going():
            run.may_send = False
            return False
        ready = self._pacer.due(now)
        if ready:
            self._send_released(ready, now, run)
            return True
        if self._pacer.has_room() and (run.poll_at is None or now >= run.poll_at or self._wakeup.is_set()):
            fetched = self._fetch(now, run)
            if fetched:  # what the batch released at once (all of it without caps) is sent at the fetch
                released = self._pacer.due(now)
                self._send_released(released, now, run)
                if released and run.sends_go_on(self.clock):  # all sent: fetch to last send is a measure
                    self._measure(len(released), (self.clock.now() - now).total_seconds())
            if fetched is not False:
                return True  # a batch taken, or a failed fetch (paused): turn again
            if not run.wait_for_due:
                return False  # nothing more is due: what waits for a later slot is placed or deferred at the end
            # rows come into the look-ahead one slot at a time: fetch them half a look-ahead at a time
            run.poll_at = max(self._next_poll(now + run.ahead) - run.ahead, now + run.ahead / 2)
        if not run.wait_for_due and self._pacer.has_room():
            return False  # (full in a one-shot run: wait for sends to free room)
        self._wait(now, run)
        return True

    def _fetch(self, now: datetime, run: DispatchRun) -> bool | None:
        """Fetch a batch into the pacer: True when one came, False when nothing did, None when the fetch failed."""
        self._wakeup.clear()
        try:
            batch = self.store_port.fetch_due(now + run.ahead, self._fetch_limit(now, run))
        except Exception as exc:
            run.report.fetch_failures += 1
            self.fetch_breaker.failure(exc)
            _log.warning("fetching due messages failed: %r", exc, extra={lf.REASON: repr(exc)})
            self.clock.sleep(run.bounded(self.fetch_breaker.failure_delay, self.clock))
            return None
        self.fetch_breaker.success()
        if not batch:
            return False
        self._disagreements = 0
        run.report.batches += 1
        run.report.deferred += self._defer(self._pacer.take(batch, now), run.report)
        run.poll_at = None
        return True

    def _wait(self, now: datetime, run: DispatchRun) -> None:
        """Sleep until the next poll or the next held message's tick, whichever is first (or a wake-up)."""
        wake = run.poll_at if self._pacer.has_room() and run.poll_at is not None else None
        held = self._pacer.next_at()
        if held is not None:
            held = max(held, now + timedelta(seconds=PACE_TICK))
            wake = held if wake is None else min(wake, held)
        seconds = self.settings.max_idle_sleep if wake is None else (wake - now).total_seconds()
        self._settler.finish()
        self.clock.wait(self._wakeup, run.bounded(max(0.0, seconds), self.clock))

    def _end_run(self, run: DispatchRun) -> None:
        """Empty the pacer: send what may go now (placed), defer the rest, and save the schedule."""
        sends, deferrals = self._pacer.drain(self.clock.now(), may_send=run.may_send)
        if sends:
            self._send_released(sends, self.clock.now(), run)
        run.report.deferred += self._defer(deferrals, run.report)
        if run.may_send:
            self._pacer.save_state(self.clock.now(), force=True)

    def _next_poll(self, now: datetime) -> datetime:
        """After an empty fetch at ``now``: when the store may have something to fetch (backing off while the store
        says something is due that a fetch does not return), at most ``max_idle_sleep`` away."""
        self._settler.finish()  # before asking for the next due row: it must not be one being removed
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

    def _send_released(self, released: Sequence[Release], now: datetime, run: DispatchRun) -> None:
        """Send what the pacer released (each with its delay), in batches of ``batch_size``, and settle them."""
        size = self.settings.batch_size
        for start in range(0, len(released), size):
            chunk = released[start : start + size]
            messages = [r.message for r in chunk]
            try:
                part = self.dispatch_batch(
                    messages, now, lambda: run.sends_go_on(self.clock), {r.message.message_id: r for r in chunk}
                )
            except Exception as exc:
                # settling failed (store down after the sends): unsettled claims expire and are sent again
                self.store_breaker.failure(exc)
                _log.warning("settling a dispatched batch failed: %r", exc, extra={lf.REASON: repr(exc)})
                self.clock.sleep(run.bounded(self.store_breaker.failure_delay, self.clock))
                continue
            self.store_breaker.success()
            run.report.merge(part)
            if part.failed_attempts and not part.dispatched:
                # every send in the batch failed: pause as NServiceBus does (1 s armed, 10 s tripped)
                self.clock.sleep(run.bounded(self.dispatch_breaker.failure_delay, self.clock))

    def _measure(self, messages: int, seconds: float) -> None:
        """Fold a batch's time per message (its fetch to its last send) into the moving average ``_fetch_limit``
        divides the time left by."""
        per = max(0.0, seconds) / max(1, messages)
        self._per_message = per if self._per_message == 0.0 else (self._per_message + per) / 2

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
        if not self.settings.enabled:
            while not stop.is_set():
                self.clock.wait(self._wakeup, self.settings.max_idle_sleep)
                self._wakeup.clear()
            return DispatchReport()
        return self._then_settle(lambda: self._loop(None, wait_for_due=True, keep_going=None, stop=stop))

    def close(self) -> None:
        """Release the worker threads."""
        self._settler.finish()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._settler.close()


def ensure_enabled(settings: DelayedDeliverySettings) -> None:
    """Raise ``DelayedDeliveryDisabledError`` when the settings switch delayed delivery off."""
    if not settings.enabled:
        raise DelayedDeliveryDisabledError(
            "delayed delivery is disabled (DELAYED_DELIVERY_ENABLED=false): only native delays are allowed"
        )
