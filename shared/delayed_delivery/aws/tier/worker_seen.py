"""What one dispatch worker's partition met, kept on S3 and met again (``timebuckets/seen.py``, #31).

A partition keeps a whole *snapshot* when its worker hands it over or finishes it, and a *delta* after every other
piece: what the piece met (sent, cancelled, moved, to the error queue, or written back: marked), written after the
piece's sends and before the progress that names it, in one request of a piece's size. A worker that takes the
partition again loads the snapshot, then the deltas after it in order up to its progress; it reads lines again only
after the last of them. A later plan of the bucket (this one lost, or expired) loads every earlier plan's snapshot and
deltas, so a kill followed by a lost plan repeats at most the piece in hand. The design is in docs/buckets.md
("Bursts").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...timebuckets.apply import Seen
from ...timebuckets.plans import DispatchPlan, partition_of
from ...timebuckets.seen import MAX_SEEN_BYTES, SeenEntry, SeenSnapshot
from .plan_store import PlanStore, seen_name
from .timer_work import Tally

__all__ = ["PartitionSeen"]

#: A partition's seen objects: (None for the snapshot, or the delta's (object, line)), key.
_Chain = list[tuple[tuple[int, int] | None, str]]


class PartitionSeen:
    """The ``Seen`` of one partition of a plan, with its snapshots and deltas on S3."""

    def __init__(self, plans: PlanStore, plan: DispatchPlan, partition: int, tally: Tally[Any]) -> None:
        self.plans = plans
        self.plan = plan
        self.partition = partition
        self.tally = tally
        self.seen = Seen()
        #: After ``restore``: where the whole snapshot it loaded stands, how many deltas it loaded after it, and
        #: whether the deadline stopped it before the last of them.
        self.base = (0, 0)
        self.deltas_loaded = 0
        self.cut = False

    def restore(self, last: tuple[int, int], time_left: Callable[[], bool] = lambda: True) -> tuple[int, int]:
        """Meet what this partition kept up to ``last`` (its progress) and what earlier plans of the bucket handed on;
        the point up to which that is known (the lines after it must be read again). ``time_left`` is asked before
        each delta but the first: when it says no, the deltas after stay unread (``cut``).

        Earlier plans' objects are read only while this partition has kept no snapshot: its snapshot holds what they
        handed on (a worker writes it from everything it met, inherited too), so an invocation does not read them
        all again (in the crash lab, that alone filled invocation after invocation)."""
        plan = self.plan
        self.base, self.deltas_loaded, self.cut = (0, 0), 0, False
        chains: dict[tuple[int, int], _Chain] = {}
        for key in self.plans.seen_keys(plan.bucket):
            name = seen_name(key)
            if name is not None:
                chains.setdefault((name.plan_ms, name.partition), []).append((name.position, key))
        own = chains.get((plan.created_ms, self.partition), [])
        snapshot = self._own_snapshot(own)
        if snapshot is None:
            for (plan_ms, _), keys in chains.items():
                if plan_ms != plan.created_ms:
                    self._inherit(keys)  # a plan of this bucket before this one (lost, or expired): what it handed on
        else:
            self.seen.load(snapshot.entries)
            self.base = snapshot.position
        return self._load_deltas(own, last, time_left)

    def snapshot(self, position: tuple[int, int], *, done: bool) -> None:
        """Keep everything met up to ``position`` (written before the progress that names it)."""
        entries = self.seen.entries()
        self.seen.take_fresh()
        self._write(position, entries, done=done, delta=False)

    def delta(self, position: tuple[int, int]) -> None:
        """Keep what was met since the last snapshot or delta, up to ``position`` (before the progress names it)."""
        entries = self.seen.take_fresh()
        if entries:
            self._write(position, entries, done=False, delta=True)

    def _write(self, position: tuple[int, int], entries: tuple[SeenEntry, ...], *, done: bool, delta: bool) -> None:
        plan, seen = self.plan, self.seen
        at, line = position
        snapshot = SeenSnapshot(
            plan.bucket, plan.created_ms, self.partition, plan.partitions, at, line, done, seen.overflow, entries, delta
        )
        self.plans.write_seen(snapshot)
        self.tally.add(**({"deltas_written": 1} if delta else {"snapshots_written": 1}))

    def _read(self, key: str, *, delta: bool) -> SeenSnapshot | None:
        snapshot = self.plans.read_seen(key, MAX_SEEN_BYTES)
        if snapshot is None or snapshot.delta != delta:
            return None
        self.tally.add(**({"deltas_read": 1} if delta else {"snapshots_read": 1}))
        return snapshot

    def _ours(self, snapshot: SeenSnapshot) -> bool:
        plan = self.plan
        return (snapshot.bucket, snapshot.plan_ms, snapshot.partition, snapshot.partitions) == (
            plan.bucket,
            plan.created_ms,
            self.partition,
            plan.partitions,
        )

    def _own_snapshot(self, keys: _Chain) -> SeenSnapshot | None:
        """This partition's whole snapshot, wherever it was taken.

        One past the progress was written by a worker that died, or lost the partition, after a piece's sends and
        before the record that names it. It is loaded all the same: a snapshot is written only once everything in it
        was handed on (sent, written back, held, to the error queue), and it holds everything met before it (it
        replaced the one before). Left out, the piece it ends with was sent again, and what was met before it was
        rebuilt from the deltas alone, which do not cover the pieces that ended at a hand-over: a later copy of a
        message met in one of those, or a later plan of the bucket, sent it again."""
        for position, key in keys:
            snapshot = self._read(key, delta=False) if position is None else None
            if snapshot is not None and self._ours(snapshot):
                return snapshot
        return None

    def _load_deltas(self, keys: _Chain, last: tuple[int, int], time_left: Callable[[], bool]) -> tuple[int, int]:
        """Load this partition's deltas after its snapshot in order up to ``last`` while ``time_left`` (the first
        unreadable one ends it: the lines after it are read again); where the lines must be read again from."""
        start = self.base
        for position, key in sorted((p, k) for p, k in keys if p is not None and start < p <= last):
            if self.deltas_loaded and not time_left():  # at least one each invocation: it gets further
                self.cut = True
                break
            delta = self._read(key, delta=True)
            if delta is None or not self._ours(delta) or delta.position != position:
                break
            self.seen.load(delta.entries)
            self.deltas_loaded += 1
            start = position
        return start

    def _inherit(self, keys: _Chain) -> None:
        """Meet the messages one partition of an earlier plan handed on (its snapshot, then the deltas after it) that
        belong to this partition; a message a later delta marks written back waits in the bucket and is not met."""
        handed = Seen(self.seen.limit)
        start = (0, 0)
        for position, key in sorted(keys, key=lambda item: item[0] or (-1, -1)):  # the snapshot first
            if position is not None and position < start:
                continue  # the snapshot holds it
            snapshot = self._read(key, delta=position is not None)
            if snapshot is None or snapshot.plan_ms == self.plan.created_ms or snapshot.position < start:
                continue
            handed.load(snapshot.entries)
            start = snapshot.position if position is None else start
        partitions, k = self.plan.partitions, self.partition
        mine = (e for e in handed.entries() if partition_of(e[0], partitions) == k)
        self.tally.add(inherited=self.seen.load(mine, handed_on_only=True))
