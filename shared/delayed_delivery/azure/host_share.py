"""Each dispatcher host takes its fair share of the shards: ⌈shards / hosts alive⌉ at once, the rest only if left free.

A host announces itself at the start of each run: the blob ``hosts/<id>`` in the lease container, whose metadata
``expires`` (epoch seconds) outlives the gap to its next run. The hosts alive are the announcements not yet expired
(this one included). A run holds at most its share at once; a shard still free ``grace`` seconds into the run
(nobody else took it: the other hosts are gone, or hold their share) may be taken beyond it, so the shards of a host
that died are dispatched, late by the grace, never left. The first run after a new host appears can still be
uneven (the others took their shards before it announced itself); from the next run on the shares hold.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from datetime import datetime

from azure.core.exceptions import AzureError
from azure.storage.blob import ContainerClient

from .. import logfields as lf

__all__ = ["HOSTS_PREFIX", "HostRegistry", "ShareGate"]

HOSTS_PREFIX = "hosts/"
_EXPIRES = "expires"

_log = logging.getLogger("delayed_delivery.azure.host_share")


class HostRegistry:
    """The hosts that dispatch one table, each announced by a blob that expires."""

    def __init__(self, container: ContainerClient, host_id: str, now: Callable[[], datetime]) -> None:
        self.container = container
        self.host_id = host_id
        self._now = now

    def announce(self, ttl: float) -> int:
        """Announce this host for ``ttl`` seconds; how many hosts are alive (1 when the registry cannot be read)."""
        now = self._now().timestamp()
        try:
            self.container.upload_blob(
                HOSTS_PREFIX + self.host_id, b"", overwrite=True, metadata={_EXPIRES: str(int(now + ttl))}
            )
            alive = 0
            for blob in self.container.list_blobs(name_starts_with=HOSTS_PREFIX, include=["metadata"]):
                expires = (blob.metadata or {}).get(_EXPIRES, "")
                if expires.isdigit() and int(expires) > now:
                    alive += 1
        except AzureError as exc:  # take every shard, as a lone host would: late is better than never
            _log.warning("reading the host registry failed", extra={lf.EVENT: "hosts_unread", lf.REASON: repr(exc)})
            return 1
        return max(1, alive)


class ShareGate:
    """How many shards one run may hold: its share at once, and any shard left free once the grace is over."""

    def __init__(self, share: int, grace_ends: float, monotonic: Callable[[], float]) -> None:
        self.share = max(1, share)
        self._grace_ends = grace_ends
        self._monotonic = monotonic
        self._held = 0
        self._lock = threading.Lock()

    @classmethod
    def of(cls, shards: int, hosts: int, grace_ends: float, monotonic: Callable[[], float]) -> ShareGate:
        """The gate of one host among ``hosts`` over ``shards``: a share of ⌈shards / hosts⌉."""
        return cls(math.ceil(shards / max(1, hosts)), grace_ends, monotonic)

    def reserve(self) -> bool:
        """Reserve a place for one more shard (before trying its lease); False when the share is full."""
        with self._lock:
            if self._held >= self.share and self._monotonic() < self._grace_ends:
                return False
            self._held += 1
            return True

    def unreserve(self) -> None:
        """Give a place back (the lease was not won, or was lost)."""
        with self._lock:
            self._held = max(0, self._held - 1)
