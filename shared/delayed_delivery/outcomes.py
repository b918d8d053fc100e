"""What becomes of each dispatched message: sent and removed, retried later, or moved to the error queue.

``Outcomes`` sends one claimed message (with the delay release control gave it), removes it under its claim, or
counts its failure: it backs off (its due time pushed forward) until ``number_of_retries`` is passed, then goes to
the error queue with the reason in a header. ``DispatchReport`` counts what a dispatcher call did.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from . import headers as hdr
from . import logfields as lf
from .breaker import FailureRateCircuitBreaker, RepeatedFailuresCircuitBreaker
from .clock import Clock
from .errors import PermanentError, ThrottledError
from .model import DelayedMessage
from .pacing import Release
from .ports import (
    BatchRemovingStore,
    BoundedTransport,
    DelayedMessageStore,
    PlacingTransport,
    ReschedulableStore,
    Transport,
    UnsentFailureStore,
    claim_of,
    claimed_until,
)
from .settings import DelayedDeliverySettings

__all__ = ["CLAIM_MARGIN", "DispatchReport", "Outcomes"]

_log = logging.getLogger("delayed_delivery.dispatcher")

#: A fetched message is not sent once its claim has less than this left (seconds), beyond the longest a send takes
#: (``BoundedTransport.send_timeout``): another dispatcher may fetch it the moment the claim runs out, and an operator
#: may then be told it is cancelled, so a send that could still be under way then could deliver it twice, or after a
#: "cancelled".
CLAIM_MARGIN = 2.0


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


class Outcomes:
    """Sends claimed messages one at a time and settles each (module docstring)."""

    def __init__(
        self,
        store: DelayedMessageStore,
        transport: Transport,
        settings: DelayedDeliverySettings,
        clock: Clock,
        breakers: tuple[RepeatedFailuresCircuitBreaker, FailureRateCircuitBreaker],
        log_fields: Mapping[str, str],
    ) -> None:
        self.store = store
        self.transport = transport
        self.settings = settings
        self.clock = clock
        self.dispatch_breaker, self.recovery_breaker = breakers
        self._log_fields = dict(log_fields)
        #: Seconds of claim a send needs: the transport's bound on one send (0 when it says none) and the margin.
        self.claim_needed = CLAIM_MARGIN + (transport.send_timeout if isinstance(transport, BoundedTransport) else 0.0)

    def settle(self, sent: list[tuple[DelayedMessage, float, float | None]]) -> DispatchReport:
        """Remove sent messages in one ``remove_many`` call and log each outcome."""
        assert isinstance(self.store, BatchRemovingStore)
        report = DispatchReport()
        ids = [m.message_id for m, _, _ in sent]
        claims = [claim_of(m) for m, _, _ in sent]
        if any(c is not None for c in claims):
            flags = self.store.remove_many(ids, claims)
        else:  # a store without claim tokens (its remove_many may not take them)
            flags = self.store.remove_many(ids)
        for (message, lateness, lag), removed in zip(sent, flags, strict=True):
            report.already_removed += self._log_removal(message, lateness, removed, lag)
        return report

    def send(
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

    def claim_ran_out(self, message: DelayedMessage) -> bool:
        """Whether too little of ``message``'s claim is left for a send to end within it (the transport's bound on one
        send plus ``CLAIM_MARGIN``; logged): then it is not sent."""
        until = claimed_until(message)
        if until is None or self.clock.now() < until - timedelta(seconds=self.claim_needed):
            return False
        _log.warning(
            "not sent: too little of its claim is left for a send to end within it (a slow batch); its row is fetched"
            " again",
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
            return self.store.remove(message.message_id)
        return self.store.remove(message.message_id, claim)

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
        if claim is None:
            counted = self.store.increment_failure_count(message.message_id)
        elif isinstance(exc, PermanentError | ThrottledError) and isinstance(self.store, UnsentFailureStore):
            counted = self.store.count_unsent_failure(message.message_id, claim)  # refused: nothing was put
        else:  # a timeout or reset may have put it all the same
            counted = self.store.increment_failure_count(message.message_id, claim)
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
        if isinstance(self.store, ReschedulableStore):
            backoff = min(self.settings.max_retry_backoff, self.settings.retry_backoff * 2 ** (failures - 1))
            due = self.clock.now() + timedelta(seconds=backoff)
            claim = claim_of(message)
            if claim is None:
                self.store.reschedule(message.message_id, due)
            else:
                self.store.reschedule(message.message_id, due, claim)

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
