"""Each shard's release schedule, kept between timer runs in a small blob of the lease container.

A shard's dispatcher places messages up to 7 days ahead (the queue's visibility timeout), so the next run, or the
next instance to hold the shard's lease, must continue the schedule rather than start again from now. The blob
``release-schedule-<shard>.json`` (format version 1, a JSON object: ``{"v": 1, "shard", "shards", "saved_at":
ISO-8601 UTC, "next_free": {queue: epoch seconds}}``) is written before a batch booked more than a second ahead is
sent, and at the end of every run. ``read_release_lags`` gives operators each destination's current release lag
(the latest next free slot of any shard, less now).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from ..clock import Clock, SystemClock, utc
from .sdk_errors import translate

__all__ = ["BlobReleaseState", "read_release_lags", "release_blob_name"]

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


def read_release_lags(container: Any, shards: int, now: datetime) -> dict[str, float]:
    """Each destination's release lag in seconds (its latest next free slot over the shards, less ``now``)."""
    latest: dict[str, float] = {}
    for shard in range(shards):
        for destination, when in BlobReleaseState(container, shard, shards).load().items():
            latest[destination] = max(latest.get(destination, when), when)
    moment = utc(now).timestamp()
    return {d: max(0.0, t - moment) for d, t in sorted(latest.items())}
