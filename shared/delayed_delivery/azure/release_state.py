"""The release schedule of a delays table, kept between timer runs in a small blob of the lease container.

The dispatchers place messages up to 7 days ahead (the queue's visibility timeout), so the next run, or the next
instance to hold a shard's lease, must continue the schedule rather than start again from now. Every shard books
from one schedule (``SharedBlobReleaseState``, the blob ``release-schedule.json``: ``{"v": 1, "shards",
"saved_at": ISO-8601 UTC, "next_free": {queue: epoch seconds}}``), so a cap is shared by what each shard has due:
a burst that lands in one partition gets the whole cap. A booking reads the blob, adds its slots after everything
booked there and writes it back only if no other shard wrote meanwhile (its ETag), else books again. Two requests
per fetched batch with a capped message.

Before, each shard kept its own schedule at ``1 / shards`` of every cap in ``release-schedule-<shard>.json`` (the
same format with ``"shard"``, ``BlobReleaseState``); the shared schedule starts from the latest of those.
``read_release_lags`` gives operators each destination's current release lag (its next free slot, less now).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

from ..clock import Clock, SystemClock, utc
from ..errors import TransientError
from .sdk_errors import is_status, translate

__all__ = [
    "CALENDAR_BLOB",
    "BlobReleaseState",
    "SharedBlobReleaseState",
    "encode_calendar",
    "read_release_lags",
    "release_blob_name",
]

#: The blob of the schedule every shard books from.
CALENDAR_BLOB = "release-schedule.json"
#: Bookings tried before giving up (others kept writing first), and the longest pause between two.
_BOOK_ATTEMPTS = 60
_BOOK_PAUSE = 0.2

_VERSION = 1
#: Most destinations a schedule keeps (as many as ``release_rates`` may name, plus the ones under ``"*"``).
_MAX_DESTINATIONS = 10_000


def release_blob_name(shard: int) -> str:
    """The blob of ``shard``'s schedule in the lease container."""
    return f"release-schedule-{shard:03d}.json"


def encode_schedule(shard: int, shards: int, saved_at: datetime, next_free: Mapping[str, float]) -> str:
    """The blob's content (format version 1)."""
    return json.dumps(
        {
            "v": _VERSION,
            "shard": shard,
            "shards": shards,
            "saved_at": utc(saved_at).isoformat(),
            "next_free": {d: round(t, 6) for d, t in sorted(next_free.items())},
        },
        sort_keys=True,
    )


def encode_calendar(shards: int, saved_at: datetime, next_free: Mapping[str, float]) -> str:
    """The shared schedule's content (format version 1)."""
    return json.dumps(
        {
            "v": _VERSION,
            "shards": shards,
            "saved_at": utc(saved_at).isoformat(),
            "next_free": {d: round(t, 6) for d, t in sorted(next_free.items())},
        },
        sort_keys=True,
    )


def decode_schedule(text: str) -> dict[str, float]:
    """The ``next_free`` of a saved schedule; ``ValueError`` for anything that is not a version-1 schedule."""
    data: Any = json.loads(text)
    if not isinstance(data, dict) or data.get("v") != _VERSION or not isinstance(data.get("next_free"), dict):
        raise ValueError("not a version-1 release schedule")
    out: dict[str, float] = {}
    for destination, when in list(data["next_free"].items())[:_MAX_DESTINATIONS]:
        number = isinstance(when, int | float) and not isinstance(when, bool)
        if isinstance(destination, str) and number and math.isfinite(when):
            out[destination] = float(when)
    return out


class BlobReleaseState:
    """``ReleaseStateStore`` of one shard: its blob in the lease container (module docstring)."""

    def __init__(self, container: Any, shard: int, shards: int, *, clock: Clock | None = None) -> None:
        self.container = container
        self.shard = shard
        self.shards = shards
        self.clock = clock or SystemClock()
        self.blob = release_blob_name(shard)

    def load(self) -> Mapping[str, float]:
        """The saved schedule; empty when there is none or it cannot be read as one (logged by the dispatcher)."""
        try:
            text = self.container.download_blob(self.blob).readall().decode("utf-8")
        except ResourceNotFoundError:
            return {}
        except AzureError as exc:
            raise translate(exc, f"reading {self.blob}") from exc
        try:
            return decode_schedule(text)
        except (ValueError, TypeError):
            return {}  # unreadable: start from now (slots may overlap for a while; nothing is lost)

    def save(self, state: Mapping[str, float]) -> None:
        """Overwrite the blob with ``state``."""
        data = encode_schedule(self.shard, self.shards, self.clock.now(), state).encode("utf-8")
        try:
            self.container.upload_blob(self.blob, data, overwrite=True, timeout=10)
        except AzureError as exc:
            raise translate(exc, f"writing {self.blob}") from exc


class SharedBlobReleaseState:
    """``SharedReleaseState`` of a table: the one schedule all its shards book from (module docstring)."""

    def __init__(self, container: Any, shards: int, *, clock: Clock | None = None) -> None:
        self.container = container
        self.shards = shards
        self.clock = clock or SystemClock()

    def load(self) -> Mapping[str, float]:
        """The schedule as saved (empty when none was, or it cannot be read as one)."""
        return self._read()[0]

    def save(self, state: Mapping[str, float]) -> None:
        """Take ``state`` in: each destination's next free slot becomes the later of the saved one and ``state``'s."""
        self.book(lambda latest: _later(latest, state))

    def book(self, plan: Callable[[Mapping[str, float]], Mapping[str, float]]) -> None:
        """Write ``plan(saved schedule)`` unless another shard wrote meanwhile; then plan again on theirs."""
        for attempt in range(_BOOK_ATTEMPTS):
            saved, etag = self._read()
            if self._write(plan(saved), etag):
                return
            time.sleep(random.uniform(0.0, min(_BOOK_PAUSE, 0.005 * 2**attempt)))
        raise TransientError(f"booking release slots in {CALENDAR_BLOB}: other shards kept writing first")

    def _read(self) -> tuple[dict[str, float], str | None]:
        """The saved schedule and its ETag; without the blob, the latest of the shards' own schedules and None."""
        try:
            download = self.container.download_blob(CALENDAR_BLOB)
            text = download.readall().decode("utf-8")
            etag = str(download.properties.etag)
        except ResourceNotFoundError:
            return _latest(BlobReleaseState(self.container, s, self.shards).load() for s in range(self.shards)), None
        except AzureError as exc:
            raise translate(exc, f"reading {CALENDAR_BLOB}") from exc
        try:
            return decode_schedule(text), etag
        except (ValueError, TypeError):
            return {}, etag  # unreadable: start from now (slots may overlap for a while; nothing is lost)

    def _write(self, state: Mapping[str, float], etag: str | None) -> bool:
        """Write ``state`` if the blob is still as read (``etag``; None: still missing); False when it changed."""
        data = encode_calendar(self.shards, self.clock.now(), state).encode("utf-8")
        condition: dict[str, Any] = (
            {"overwrite": False} if etag is None else {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        )
        try:
            self.container.upload_blob(CALENDAR_BLOB, data, timeout=10, **({"overwrite": True} | condition))
        except (ResourceExistsError, ResourceModifiedError):
            return False
        except AzureError as exc:
            if is_status(exc, 409, 412):
                return False
            raise translate(exc, f"writing {CALENDAR_BLOB}") from exc
        return True


def _later(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return _latest([a, b])


def _latest(schedules: Any) -> dict[str, float]:
    """Per destination, the latest next free slot of ``schedules``."""
    latest: dict[str, float] = {}
    for schedule in schedules:
        for destination, when in schedule.items():
            latest[destination] = max(latest.get(destination, when), when)
    return latest


def read_release_lags(container: Any, shards: int, now: datetime) -> dict[str, float]:
    """Each destination's release lag in seconds (its next free slot, less ``now``)."""
    latest = dict(SharedBlobReleaseState(container, shards).load())
    moment = utc(now).timestamp()
    return {d: max(0.0, t - moment) for d, t in sorted(latest.items())}
