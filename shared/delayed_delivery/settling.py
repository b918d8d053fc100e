"""Settling sent batches on a batch-removing store: one ``remove_many`` per batch, at once or in the background.

In the background (the dispatcher's ``overlap_removal``) a batch's removal runs in one worker thread while the next
batch is fetched and sent; the store must not hand a row out again before its removal has finished. A failed
background removal trips the store breaker, as an inline one does: the rows keep their claims, which expire, and
are sent again (a duplicate, never a loss).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from . import logfields as lf
from .breaker import RepeatedFailuresCircuitBreaker
from .model import DelayedMessage
from .outcomes import DispatchReport, Outcomes

__all__ = ["Sent", "Settler"]

_log = logging.getLogger("delayed_delivery.dispatcher")  # the dispatcher's log lines, as before the move

#: A sent message, its transport lateness (seconds) and the release lag it carries (None without release control).
Sent = tuple[DelayedMessage, float, float | None]


class Settler:
    """Removes each batch's sent messages in one call: inline, or (``background``) while the next batch goes."""

    def __init__(self, outcomes: Outcomes, store_breaker: RepeatedFailuresCircuitBreaker, *, background: bool) -> None:
        self._outcomes = outcomes
        self._store_breaker = store_breaker
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="settle") if background else None
        self._pending: Future[DispatchReport] | None = None
        self._settled = DispatchReport()

    def settle(self, sent: list[Sent]) -> DispatchReport:
        """Remove ``sent``: inline (its report), or in the background (the previous batch's report, or its error)."""
        if self._pool is None:
            return self._outcomes.settle(sent) if sent else DispatchReport()
        error: Exception | None = None
        report = DispatchReport()
        try:  # the previous batch's removal, which ran while this batch was fetched and sent
            report = self._wait()
        except Exception as exc:
            error = exc
        if sent:
            self._pending = self._pool.submit(self._outcomes.settle, sent)
        if error is not None:
            raise error
        return report

    def finish(self) -> None:
        """Wait for the background removal and keep its report; a failure trips the store breaker, as inline."""
        try:
            self._settled.merge(self._wait())
        except Exception as exc:
            # unsettled rows keep their claims, which expire: they are sent again (a duplicate, never a loss)
            self._store_breaker.failure(exc)
            _log.warning("settling a dispatched batch failed: %r", exc, extra={lf.REASON: repr(exc)})

    def collect(self) -> DispatchReport:
        """What the removals finished by ``finish`` reported since the last call."""
        report, self._settled = self._settled, DispatchReport()
        return report

    def close(self) -> None:
        """Release the worker thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _wait(self) -> DispatchReport:
        """Wait for the background removal, if any; its report (or its exception)."""
        pending, self._pending = self._pending, None
        return DispatchReport() if pending is None else pending.result()
