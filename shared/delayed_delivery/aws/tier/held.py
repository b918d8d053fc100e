"""Messages a release cap holds back, kept apart per destination so that waiting costs nothing per run (#31).

A message whose destination has no release slot within SQS's 900 s (``release_rates``) used to be written back
into its bucket and read and rewritten by every run: a held backlog cost the square of its size (about 5,300 held
messages meant 63,319 rewrites in 25 minutes), and one over the inline bound was planned again every cycle. Now it
is written once into its destination's *held area*, ``<prefix>/held/<destination>/fine/<start ISO>/<hash>-<count>
.jsonl.gz``: bucket objects of the usual format under a prefix of their own (so every reader reads them), cut into
objects of about a minute of the destination's rate whose keys list in due order (the hash's first 16 hex
characters are the first due time's epoch ms). Each timer run then releases the destination's held messages in due
order, oldest object first, and stops at the first object the calendar cannot place whole: the objects after
it are not even read. A run's work is bounded by what it can release (plus one object), and a backlog of ``N``
costs about ``N`` line rewrites in all (``benchmarks/held_backlog.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from datetime import datetime

from botocore.exceptions import BotoCoreError, ClientError

from ...release import ReleaseRates
from ...timebuckets.format import MAX_OBJECT_MESSAGES, BucketMessage
from ...timebuckets.wheel import FINE
from .store import S3BucketStore, StoredObject, translate_s3_error

__all__ = ["HELD", "MIN_HELD_OBJECT", "HeldArea"]

#: The key segment of the held areas under the tier's prefix.
HELD = "held"
#: The fewest messages a held object is cut into (a very slow cap would otherwise make objects of one message).
MIN_HELD_OBJECT = 100


class HeldArea:
    """The held areas of one tier's store: one per capped destination that has held messages."""

    def __init__(self, store: S3BucketStore, rates: ReleaseRates | None = None) -> None:
        self.store = store
        self.rates = rates
        self.root = f"{store.prefix}/{HELD}"

    def store_for(self, destination: str) -> S3BucketStore:
        """The store of ``destination``'s held messages: objects of about one minute of its rate."""
        rate = self.rates.rate_for(destination) if self.rates is not None else None
        size = MAX_OBJECT_MESSAGES if rate is None else math.ceil(rate * 60)
        size = max(MIN_HELD_OBJECT, min(MAX_OBJECT_MESSAGES, size))
        return S3BucketStore(
            self.store.client,
            self.store.bucket_name,
            f"{self.root}/{destination}",
            self.store.levels,
            max_object_messages=size,
            max_object_bytes=self.store.max_object_bytes,
            ordered_keys=True,
        )

    def hold(self, messages: Sequence[BucketMessage], now: datetime) -> int:
        """Write ``messages`` into their destinations' held areas (in the fine bucket of each due time); how many."""
        by_destination: dict[str, list[BucketMessage]] = {}
        for message in messages:
            by_destination.setdefault(message.destination, []).append(message)
        for destination, group in sorted(by_destination.items()):
            self.store_for(destination).write_due(group, now)
        return len(messages)

    def destinations(self) -> list[str]:
        """The destinations with a held area (one listing of the held root, by delimiter)."""
        names: list[str] = []
        paginator = self.store.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.store.bucket_name, Prefix=f"{self.root}/", Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    name = str(common["Prefix"]).removeprefix(f"{self.root}/").rstrip("/")
                    if name:
                        names.append(name)
        except (ClientError, BotoCoreError) as exc:
            raise translate_s3_error(exc, f"list {self.root}/", self.store.bucket_name) from exc
        return names

    def objects(self) -> Iterator[StoredObject]:
        """Every held object, destination by destination, oldest bucket first (listings only: for ``pending``)."""
        for destination in self.destinations():
            yield from self.store_for(destination).objects(FINE)
