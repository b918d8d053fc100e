"""Translate azure.core exceptions into the package's one error hierarchy."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from ..errors import ConfigurationError, DelayedDeliveryError, PermanentError, ThrottledError, TransientError

__all__ = ["is_status", "sdk_errors", "translate"]

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def is_status(exc: BaseException, *statuses: int) -> bool:
    """True when ``exc`` is an HTTP error with one of ``statuses``."""
    return isinstance(exc, HttpResponseError) and exc.status_code in statuses


_POOL = re.compile(r"host='([^']+)', port=(\d+)")
_REASON = re.compile(r"(\[Errno -?\d+\] [^\"')]+|timed out|Name or service not known|Connection reset by peer)")


def unreachable_text(message: str) -> str:
    """An unreachable endpoint in a few words: urllib3's ``HTTPConnectionPool(host=…, port=…): Max retries exceeded
    with url: … (Caused by NewConnectionError(…: [Errno 111] Connection refused))`` becomes ``cannot connect to
    127.0.0.1:10002 ([Errno 111] Connection refused)``; other texts are cut at 200 characters."""
    pool, reason = _POOL.search(message), _REASON.search(message)
    if pool is not None:
        return f"cannot connect to {pool.group(1)}:{pool.group(2)}" + (f" ({reason.group(1)})" if reason else "")
    return message if len(message) <= 200 else message[:199] + "…"


def translate(exc: AzureError, what: str) -> DelayedDeliveryError:
    """The core error for an Azure SDK exception raised while doing ``what``."""
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        return TransientError(f"{what}: storage unreachable: {unreachable_text(str(exc.message))}")
    if isinstance(exc, ClientAuthenticationError):
        return ConfigurationError(f"{what}: not authorised (check the identity's role assignments): {exc.message}")
    if isinstance(exc, ResourceNotFoundError):
        return ConfigurationError(f"{what}: resource not found (run setup_infrastructure first?): {exc.message}")
    if isinstance(exc, HttpResponseError):
        status = exc.status_code or 0
        if status == 404:
            return ConfigurationError(f"{what}: not found (run setup_infrastructure first?): {exc.message}")
        if status in (429, 503):  # the service refused it for now: nothing was done
            return ThrottledError(f"{what}: storage returned {status}: {exc.message}")
        if status in _RETRYABLE_STATUS:
            return TransientError(f"{what}: storage returned {status}: {exc.message}")
        return PermanentError(f"{what}: storage returned {status}: {exc.message}")
    return TransientError(f"{what}: {exc}")


@contextmanager
def sdk_errors(what: str) -> Iterator[None]:
    """Re-raise any Azure SDK error inside the block as a core error (``raise … from exc``)."""
    try:
        yield
    except AzureError as exc:
        raise translate(exc, what) from exc
