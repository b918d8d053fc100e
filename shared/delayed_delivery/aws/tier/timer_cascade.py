"""The timer's cascade of one coarse bucket into fine buckets, in groups bounded by bytes read.

Objects are read as streams (``S3BucketStore.open``) into a group until the group holds ``group_bytes`` of
decompressed lines; the group is then deduplicated, its records applied, written into fine buckets, and the objects
read whole into it deleted, before the next group starts. So memory is bounded by bytes, whatever the counts in the
keys say. Groups are cut the same way on every run (an object that does not fit is read again at the start of the
next group; one larger than a group on its own is cut at the same lines every time), so a run that dies after a
group's writes and before its deletes writes the very same fine objects again: same keys, no copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...cancellations import StoredRecord
from ...timebuckets.apply import Found
from ...timebuckets.format import BucketMessage, read_line
from .notices import BadLines
from .store import ObjectMissingError, StoredObject
from .timer_sqs import Notice
from .timer_work import BucketWork, Tally

__all__ = ["DEFAULT_GROUP_BYTES", "Cascade"]

#: Decompressed bytes of lines one cascade group holds (its messages take about twice that in memory).
DEFAULT_GROUP_BYTES = 24 * 1024 * 1024


@dataclass(slots=True)
class _Group:
    found: list[Found] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    #: Objects read whole into this group: deleted once it is written.
    keys: list[str] = field(default_factory=list)
    size: int = 0

    @property
    def empty(self) -> bool:
        return not (self.found or self.notices or self.keys)


class Cascade:
    """Splits one coarse bucket's objects into fine buckets, a bounded group at a time."""

    def __init__(self, work: BucketWork, tally: Tally[Any], group_bytes: int, may_go_on: Callable[[], bool]) -> None:
        self.work = work
        self.tally = tally
        self.group_bytes = group_bytes
        self.may_go_on = may_go_on
        #: Records applied to messages of an object not yet deleted (a large one cut over groups), and the latest due
        #: time each met.
        self._applied: list[StoredRecord] = []
        self._until: dict[tuple[str, str], int] = {}

    def run(self, objects: Sequence[StoredObject]) -> bool:
        """Cascade ``objects`` (one coarse bucket's, in listing order); False when it stopped for time."""
        group = _Group()
        for stored in objects:
            if not self.may_go_on():
                self._flush(group)
                return False
            taken = self._take(stored, group)
            if taken is None:
                return False
            group = taken
        self._flush(group)
        return True

    def _take(self, stored: StoredObject, group: _Group) -> _Group | None:
        """Read one object into ``group`` (flushing on the way as the bound asks); the group to go on with."""
        alone = group.empty
        marks = (len(group.found), len(group.notices), group.size)
        try:
            stream = self.work.store.open(stored.key)
        except ObjectMissingError:
            return group  # deleted by another run since the listing
        header = stream.open()
        version = header.version if header is not None else 0
        bad = BadLines()  # the object's unreadable lines, summed up: one notice per object, after its last line
        for raw in stream.lines():
            if group.size and group.size + raw.size > self.group_bytes:
                if not alone:  # put this object back, write the others, read it again at the start of a group
                    del group.found[marks[0] :], group.notices[marks[1] :]
                    group.size = marks[2]
                    self._flush(group)
                    return self._take(stored, _Group()) if self.may_go_on() else None
                self._flush(group)  # one object larger than a group: written in cuts, deleted after the last
                if not self.may_go_on():
                    return None
                group = _Group()
            item = read_line(raw, version)
            if isinstance(item, BucketMessage):
                group.found.append(Found(item, stored.key))
            else:
                bad.add(item)
            group.size += raw.size
        if bad.count or stream.problem is not None:
            group.notices.append(self.work.bad_object(stored.key, stream.problem, bad))
        group.keys.append(stored.key)
        return group

    def _flush(self, group: _Group) -> None:
        """Write a group into fine buckets, then delete the objects it holds whole and apply its records."""
        if group.empty:
            return
        self.work.fresh()  # the records as they are now, for this group (#31)
        plan = self.work.plan(group.found)
        rewrite = self.work.report_errors([*plan.conflicts, *plan.unusable, *group.notices], self.tally)
        self.work.write_back(None, [*plan.keep, *plan.moved], rewrite)
        self._applied += self.work.releasable(plan.applied, rewrite)
        for key, ms in plan.applied_until.items():
            self._until[key] = max(self._until.get(key, 0), ms)
        if group.keys:
            self.work.store.delete(group.keys)
            self.work.applied(self._applied, self._until)
            self._applied, self._until = [], {}
        self.tally.add(
            cascaded_objects=len(group.keys),
            cascaded_messages=len(plan.keep) + len(plan.moved),
            duplicates_skipped=plan.duplicates,
            cancelled=plan.cancelled,
            rescheduled=len(plan.moved),
            kept_for_retry=len(rewrite),
        )
