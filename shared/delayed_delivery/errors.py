"""One error hierarchy for delayed delivery; retryability is a type, never parsed from text."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "CircuitBreakerTrippedError",
    "ConfigurationError",
    "DelayedDeliveryDisabledError",
    "DelayedDeliveryError",
    "DestinationNotFoundError",
    "DestinationRefusedError",
    "InvalidMessageError",
    "InvalidScheduleError",
    "MessageIdConflictError",
    "MessageInFlightError",
    "MessagePlacedError",
    "PermanentError",
    "ThrottledError",
    "TransientError",
    "batch_failure",
    "extra_missing",
]


class DelayedDeliveryError(Exception):
    """Root of every error this package raises on purpose."""

    #: Whether repeating the same operation later may succeed.
    retryable: bool = False


class ConfigurationError(DelayedDeliveryError, ValueError):
    """A setting, name or deployment does not meet the documented rules."""


def extra_missing(what: str, *extras: str) -> ConfigurationError:
    """The one-line error for ``what`` when an optional extra is not installed: which extra, and the pip line.

    ``cli`` in ``extras`` goes into the pip line only (the command line's own users have it already).
    """
    needed = [e for e in extras if e != "cli"] or list(extras)
    names = " and ".join(", ".join(needed).rsplit(", ", 1))
    plural = "s" if len(needed) > 1 else ""
    pip = f'pip install "delayed-delivery[{",".join(extras)}]"'
    return ConfigurationError(f"{what} needs the {names} extra{plural}: {pip}")


class InvalidMessageError(DelayedDeliveryError, ValueError):
    """The caller passed a message, delay or time that cannot be delivered."""


class InvalidScheduleError(InvalidMessageError):
    """A recurring schedule's expression, time zone or option cannot be evaluated (the message names which)."""


class DelayedDeliveryDisabledError(ConfigurationError):
    """The delay needs the delayed-delivery infrastructure, which is switched off."""


class TransientError(DelayedDeliveryError):
    """A failure that may go away: throttling, timeouts, a service briefly down."""

    retryable = True


class ThrottledError(TransientError):
    """The service refused the request for now (throttled, busy: 429, 503) and did nothing; retry later."""


class PermanentError(DelayedDeliveryError):
    """A failure that repeating will not fix: the message goes to the error queue."""


class MessageIdConflictError(InvalidMessageError):
    """A different message with this id is still pending; ids mean one message (see docs/identity.md)."""


class MessageInFlightError(TransientError):
    """A dispatcher is sending this message right now; cancel or reschedule it again shortly."""


class MessagePlacedError(MessageInFlightError):
    """The message already waits on its queue, hidden until due: it can no longer be cancelled with certainty."""


class DestinationNotFoundError(PermanentError):
    """The destination queue does not exist."""


class DestinationRefusedError(PermanentError):
    """The destination exists but refuses the caller: access denied, or a key the caller may not use.

    Permanent for this message as things stand, though an operator can fix it; a scheduler may retry it for a bounded
    time before it gives the message up to the error queue (the time-bucket timer does).
    """


class CircuitBreakerTrippedError(DelayedDeliveryError):
    """A circuit breaker saw failures for longer than its configured time."""

    def __init__(self, breaker: str, failing_for_seconds: float, last_error: BaseException | None) -> None:
        self.breaker = breaker
        self.failing_for_seconds = failing_for_seconds
        self.last_error = last_error
        super().__init__(
            f"{breaker} circuit breaker tripped after {failing_for_seconds:.1f} s of failures"
            + (f": {last_error!r}" if last_error is not None else "")
        )


def batch_failure(failures: Mapping[str, DelayedDeliveryError], total: int) -> DelayedDeliveryError:
    """One error naming every refused message of a batch of ``total`` (retryable when any refusal is)."""
    errors = list(failures.values())
    kind: type[DelayedDeliveryError]
    if any(e.retryable for e in errors):
        kind = TransientError
    elif all(isinstance(e, DestinationNotFoundError) for e in errors):
        kind = DestinationNotFoundError
    else:
        kind = PermanentError
    listed = "; ".join(f"{mid}: {error}" for mid, error in list(failures.items())[:20])
    more = f"; and {len(failures) - 20} more" if len(failures) > 20 else ""
    return kind(
        f"{len(failures)} of {total} messages were not accepted (send those again; the others were): {listed}{more}"
    )
