"""Effectively-once processing: a consumer's effect runs at most once per message id while its record lives."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from .clock import Clock, SystemClock, utc
from .errors import ConfigurationError, InvalidMessageError, TransientError

__all__ = [
    "DEFAULT_EXPIRY",
    "DEFAULT_IN_PROGRESS_TIMEOUT",
    "AlreadyDone",
    "Claim",
    "HasMessageId",
    "InMemoryProcessedLog",
    "InProgress",
    "ProcessedLog",
    "ProcessingInProgressError",
    "key_of",
    "once",
]

#: How long a completed record keeps duplicates out by default: one day.
DEFAULT_EXPIRY = timedelta(days=1)
#: How long an attempt holds its key before a duplicate may take it over (a crashed consumer's key frees then).
DEFAULT_IN_PROGRESS_TIMEOUT = timedelta(minutes=5)
#: Longest key accepted (Azure Table keys take 1 KiB; DynamoDB keys are hashed).
MAX_KEY_LENGTH = 512


class ProcessingInProgressError(TransientError):
    """Another attempt is processing this message right now; the queue should deliver it again later."""

    def __init__(self, key: str, until: datetime | None = None) -> None:
        self.key = key
        self.until = until
        when = f" (its hold ends at {until.isoformat()})" if until is not None else ""
        super().__init__(f"message {key!r} is being processed by another attempt{when}; retry later")


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

    def begin(self, key: str, *, now: datetime, in_progress_until: datetime) -> Claim | AlreadyDone | InProgress:
        """Claim ``key`` unless a live record says it is done or held (an expired record counts as none)."""
        ...

    def complete(self, claim: Claim, result: str | None, *, expires_at: datetime) -> bool:
        """Record the claim's effect as done until ``expires_at``; False when the claim was lost meanwhile."""
        ...

    def release(self, claim: Claim) -> None:
        """Forget the claim's record (the effect failed), so a later delivery processes the message."""
        ...


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
) -> Any:
    """Run ``fn`` at most once for ``message``'s id while its record lives; return its (stored) JSON result.

    A duplicate of a completed message returns the stored result without running ``fn``; a duplicate arriving while
    another attempt runs raises ``ProcessingInProgressError`` (transient: let the queue retry); a failing ``fn``
    releases the id and re-raises, so a retry processes the message.
    """
    key = key_of(message)
    expires = _seconds(expiry, "expiry")
    hold = _seconds(in_progress_timeout, "in_progress_timeout")
    clock = clock or SystemClock()
    now = utc(clock.now())
    state = log.begin(key, now=now, in_progress_until=now + hold)
    if isinstance(state, AlreadyDone):
        return None if state.result is None else json.loads(state.result)
    if isinstance(state, InProgress):
        raise ProcessingInProgressError(key, state.until)
    try:
        result = fn()
    except BaseException:
        log.release(state)
        raise
    try:
        text = json.dumps(result)
    except (TypeError, ValueError) as exc:
        log.complete(state, None, expires_at=utc(clock.now()) + expires)  # the effect happened: never again
        raise ConfigurationError(f"the result for {key!r} is not JSON-serialisable: {exc}") from exc
    log.complete(state, text, expires_at=utc(clock.now()) + expires)
    return result


@dataclass(frozen=True, slots=True)
class _Record:
    token: str
    done: bool
    until: datetime  # in progress: the hold's end; done: the record's expiry
    result: str | None = None


class InMemoryProcessedLog:
    """A ``ProcessedLog`` in one process's memory (tests, single-process consumers)."""

    def __init__(self) -> None:
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
