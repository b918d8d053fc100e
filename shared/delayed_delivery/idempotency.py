"""Effectively-once processing: a consumer's effect runs at most once per message id while its record lives."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from . import logfields as lf
from .clock import Clock, SystemClock, utc
from .errors import ConfigurationError, InvalidMessageError, PermanentError, TransientError
from .validation import is_number, is_whole

__all__ = [
    "DEFAULT_EXPIRY",
    "DEFAULT_IN_PROGRESS_TIMEOUT",
    "AlreadyDone",
    "Claim",
    "EffectNotRecordedError",
    "HasMessageId",
    "InMemoryProcessedLog",
    "InProgress",
    "ProcessedLog",
    "ProcessingInProgressError",
    "RecordRetry",
    "key_of",
    "once",
    "record_done",
    "result_text",
    "retry_record",
]

#: How long a completed record keeps duplicates out by default: one day.
DEFAULT_EXPIRY = timedelta(days=1)
#: How long an attempt holds its key before a duplicate may take it over (a crashed consumer's key frees then).
DEFAULT_IN_PROGRESS_TIMEOUT = timedelta(minutes=5)
#: Longest key accepted (Azure Table keys take 1 KiB; DynamoDB keys are hashed).
MAX_KEY_LENGTH = 512

_log = logging.getLogger("delayed_delivery.consumer")


class ProcessingInProgressError(TransientError):
    """Another attempt is processing this message right now; the queue should deliver it again later."""

    def __init__(self, key: str, until: datetime | None = None) -> None:
        self.key = key
        self.until = until
        when = f" (its hold ends at {until.isoformat()})" if until is not None else ""
        super().__init__(f"message {key!r} is being processed by another attempt{when}; retry later")


class EffectNotRecordedError(PermanentError):
    """The effect ran, but recording it as done kept failing: a delivery after the hold may run it again."""

    def __init__(self, key: str, attempts: int, last: BaseException | None) -> None:
        self.key = key
        self.attempts = attempts
        cause = f": {last}" if last is not None else ""
        super().__init__(
            f"message {key!r}: the effect ran, but recording it as done failed {attempts} times{cause}; "
            "duplicates are told to retry until its hold ends, a delivery after that runs the effect again"
        )


@dataclass(frozen=True, slots=True)
class RecordRetry:
    """How often recording an effect as done is tried: ``attempts`` in all, waiting ``first_delay`` doubling."""

    attempts: int = 5
    first_delay: float = 0.2
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if not is_whole(self.attempts, 1, 100):
            raise ConfigurationError(f"RecordRetry.attempts must be 1-100, got {self.attempts!r}")
        for name in ("first_delay", "max_delay"):
            value = getattr(self, name)
            if not (is_number(value) and value <= 3600):
                raise ConfigurationError(f"RecordRetry.{name} must be 0-3600 seconds, got {value!r}")

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failed attempt (1-based), in seconds."""
        return float(min(self.max_delay, self.first_delay * 2 ** min(failures - 1, 30)))


@runtime_checkable
class HasMessageId(Protocol):
    """Anything carrying a delayed-message id, such as ``delivery.DeliveredMessage``."""

    @property
    def message_id(self) -> str:
        """The delayed-message id."""
        ...


@dataclass(frozen=True, slots=True)
class Claim:
    """This attempt holds ``key``: run the effect, then ``complete`` or ``release`` with this claim."""

    key: str
    token: str


@dataclass(frozen=True, slots=True)
class AlreadyDone:
    """The effect for ``key`` completed; ``result`` is its JSON text (``None``: nothing stored)."""

    key: str
    result: str | None


@dataclass(frozen=True, slots=True)
class InProgress:
    """Another attempt holds ``key`` until ``until``."""

    key: str
    until: datetime | None


class ProcessedLog(Protocol):
    """Where processed message ids are recorded; every implementation passes ``testing.idempotency_contract``."""

    @property
    def max_result_chars(self) -> int | None:
        """Longest result JSON the log stores (``None``: no limit); a longer result is recorded without it."""
        ...

    def begin(self, key: str, *, now: datetime, in_progress_until: datetime) -> Claim | AlreadyDone | InProgress:
        """Claim ``key`` unless a live record says it is done or held (an expired record counts as none)."""
        ...

    def complete(self, claim: Claim, result: str | None, *, expires_at: datetime) -> bool:
        """Record the claim's effect as done until ``expires_at``; False when the claim was lost meanwhile."""
        ...

    def release(self, claim: Claim) -> None:
        """Forget the claim's record (the effect failed), so a later delivery processes the message."""
        ...

    # ``complete`` may raise ``TransientError`` (tried again after a wait) or any other error: the log refused the
    # record (e.g. a result it cannot hold), and ``once`` records the effect again without its result.


def key_of(message: str | HasMessageId) -> str:
    """The idempotency key of ``message``: its delayed-message id."""
    key = message if isinstance(message, str) else message.message_id
    if not isinstance(key, str) or not key:
        raise InvalidMessageError("effectively-once processing needs a non-empty message id")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidMessageError(f"message id longer than {MAX_KEY_LENGTH} characters: {key[:40]!r}...")
    return key


def _seconds(value: timedelta | float, what: str) -> timedelta:
    span = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if span <= timedelta(0):
        raise ConfigurationError(f"{what} must be positive, got {span.total_seconds()} s")
    return span


def once(
    log: ProcessedLog,
    message: str | HasMessageId,
    fn: Callable[[], Any],
    *,
    expiry: timedelta | float = DEFAULT_EXPIRY,
    in_progress_timeout: timedelta | float = DEFAULT_IN_PROGRESS_TIMEOUT,
    clock: Clock | None = None,
    retry: RecordRetry | None = None,
) -> Any:
    """Run ``fn`` at most once for ``message``'s id while its record lives; return its (stored) JSON result.

    A duplicate of a completed message returns the stored result without running ``fn``; a duplicate arriving while
    another attempt runs raises ``ProcessingInProgressError`` (transient: let the queue retry); a failing ``fn``
    releases the id and re-raises, so a retry processes the message. Once ``fn`` returned, its id is recorded as
    done whatever the result: see ``record_done``.
    """
    key = key_of(message)
    expires = _seconds(expiry, "expiry")
    hold = _seconds(in_progress_timeout, "in_progress_timeout")
    clock = clock or SystemClock()
    now = utc(clock.now())
    state = log.begin(key, now=now, in_progress_until=now + hold)
    if isinstance(state, AlreadyDone):
        return _stored(state)
    if isinstance(state, InProgress):
        raise ProcessingInProgressError(key, state.until)
    try:
        result = fn()
    except BaseException:
        log.release(state)
        raise
    if utc(clock.now()) > now + hold:
        _log.warning(
            "the effect outlasted its hold: a duplicate may have run it too (raise in_progress_timeout)",
            extra={lf.EVENT: lf.EVENT_HOLD_ENDED, lf.MESSAGE_ID: key},
        )
    text = result_text(key, result, log.max_result_chars)
    record_done(log, state, text, expiry=expires, in_progress_timeout=hold, clock=clock, retry=retry)
    return result


def _stored(state: AlreadyDone) -> Any:
    if state.result is None:
        return None
    try:
        return json.loads(state.result)
    except ValueError:
        _log.warning(
            "the stored result cannot be read: returning None",
            extra={lf.EVENT: lf.EVENT_RESULT_NOT_STORED, lf.MESSAGE_ID: state.key, lf.REASON: "unreadable JSON"},
        )
        return None


def result_text(key: str, result: Any, limit: int | None) -> str | None:
    """``result`` as the JSON text to store, or ``None`` (logged with the reason) when it cannot be stored."""
    try:
        text = json.dumps(result)
    except (TypeError, ValueError, RecursionError) as exc:
        reason = f"the result is not JSON-serialisable ({type(exc).__name__}: {str(exc)[:200]})"
    else:
        if limit is None or len(text) <= limit:
            return text
        reason = f"the result is {len(text):,} characters of JSON; the log stores at most {limit:,}"
    _log.warning(
        "the effect is recorded as done without its result: duplicates get None",
        extra={lf.EVENT: lf.EVENT_RESULT_NOT_STORED, lf.MESSAGE_ID: key, lf.REASON: reason},
    )
    return None


def record_done(
    log: ProcessedLog,
    claim: Claim,
    text: str | None,
    *,
    expiry: timedelta,
    in_progress_timeout: timedelta,
    clock: Clock,
    retry: RecordRetry | None = None,
) -> None:
    """Record ``claim``'s effect as done (it ran) with ``retry_record``; a lost claim is looked up again.

    ``complete`` returning False means the claim was lost: the id is then done or held by another attempt (which
    records its own effect; logged), or free again, and this attempt claims it and records its effect.
    """
    holder = [claim]

    def attempt(result: str | None) -> bool:
        now = utc(clock.now())
        if log.complete(holder[0], result, expires_at=now + expiry):
            return True
        state = log.begin(claim.key, now=now, in_progress_until=now + in_progress_timeout)
        if isinstance(state, Claim):
            holder[0] = state  # the record vanished meanwhile: this attempt holds the id again, record it now
            return False
        _log.warning(
            "the hold ended during the effect and another attempt took the id over (raise in_progress_timeout)",
            extra={lf.EVENT: lf.EVENT_HOLD_ENDED, lf.MESSAGE_ID: claim.key},
        )
        return True

    retry_record(claim.key, text, attempt, clock=clock, retry=retry)


def retry_record(
    key: str, text: str | None, attempt: Callable[[str | None], bool], *, clock: Clock, retry: RecordRetry | None = None
) -> None:
    """Call ``attempt(text)`` until it records the effect (True; False: call again at once), never silently giving up.

    A ``TransientError`` is tried again after ``retry``'s backoff (``clock.sleep``); any other error means the store
    refused the record, which is then tried without the result (logged: duplicates get None). Raises
    ``EffectNotRecordedError`` (not retryable) when it stays impossible.
    """
    policy = retry or RecordRetry()
    failures = 0
    last: Exception | None = None
    for _ in range(policy.attempts):
        try:
            if attempt(text):
                return
        except TransientError as exc:
            failures, last = failures + 1, exc
            _log.warning(
                "recording the effect as done failed: trying again",
                extra={lf.EVENT: lf.EVENT_RECORD_RETRY, lf.MESSAGE_ID: key, lf.ATTEMPT: failures, lf.REASON: str(exc)},
            )
            clock.sleep(policy.delay(failures))
        except Exception as exc:
            if text is None:
                raise EffectNotRecordedError(key, failures + 1, exc) from exc
            failures, last, text = failures + 1, exc, None
            _log.warning(
                "the store refused the result: the effect is recorded as done without it, duplicates get None",
                extra={lf.EVENT: lf.EVENT_RESULT_NOT_STORED, lf.MESSAGE_ID: key, lf.REASON: str(exc)[:500]},
            )
    raise EffectNotRecordedError(key, policy.attempts, last)


@dataclass(frozen=True, slots=True)
class _Record:
    token: str
    done: bool
    until: datetime  # in progress: the hold's end; done: the record's expiry
    result: str | None = None


class InMemoryProcessedLog:
    """A ``ProcessedLog`` in one process's memory (tests, single-process consumers)."""

    def __init__(self, *, max_result_chars: int | None = None) -> None:
        self.max_result_chars = max_result_chars
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()

    def begin(self, key: str, *, now: datetime, in_progress_until: datetime) -> Claim | AlreadyDone | InProgress:
        """Claim ``key`` unless a live record says it is done or held."""
        with self._lock:
            record = self._records.get(key)
            if record is not None and record.until > now:
                return AlreadyDone(key, record.result) if record.done else InProgress(key, record.until)
            token = uuid.uuid4().hex
            self._records[key] = _Record(token, done=False, until=in_progress_until)
            return Claim(key, token)

    def complete(self, claim: Claim, result: str | None, *, expires_at: datetime) -> bool:
        """Record the claim's effect as done until ``expires_at``."""
        with self._lock:
            record = self._records.get(claim.key)
            if record is None or record.token != claim.token:
                return False
            self._records[claim.key] = replace(record, done=True, until=expires_at, result=result)
            return True

    def release(self, claim: Claim) -> None:
        """Forget the claim's record if it still holds it."""
        with self._lock:
            record = self._records.get(claim.key)
            if record is not None and record.token == claim.token:
                del self._records[claim.key]
