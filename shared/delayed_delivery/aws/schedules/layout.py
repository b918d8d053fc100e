"""The schedules table's items: a wire format (items written today are read for years; golden files pin them).

One DynamoDB table (default ``delayed-delivery-schedules``), partition key ``pk`` (S), sort key ``sk`` (S), on demand.
A schedule belongs to one of ``SHARDS`` shards (the first 4 bytes of SHA-256 of its id, modulo ``SHARDS``); three
kinds of item:

* **row**, ``pk = "row#NN"``, ``sk = <schedule id>``: what the schedule is (definition document, destination, body,
  headers), its state, ``rev`` (grows by one on every write of the row) and a snapshot of its cursor and counters as
  of that write (``ver``, ``cur``, ``nxt``, ``fired``, ``missed``, ``skip``, ``paused``, ``last``; instants as epoch
  microseconds).
* **due page**, ``pk = "due#NN"``, ``sk = "<minute>#<tag>"`` (``<minute>``: 12-digit epoch seconds of a UTC minute):
  the due index. ``e`` holds, per schedule, an *entry*: its cursor and counters since the row's write, as the JSON
  array ``[rev, ver, cur, nxt, fired, missed]`` (``Entry``: instants in epoch seconds; ``last`` and a
  ``skipped_paused`` count to report may follow). A schedule's entry sits in the page of the minute its next
  occurrence fires in, and moves when the timer fires it: the timer writes the entries of the pages it consumed into
  new pages (one per target minute, packed) and deletes them, so the timer queries only what is due
  (``sk < <horizon minute>``) and one write carries many schedules. ``g`` is the page's generation (an operator's
  write rewrites a page without the schedule's old entry, ``g + 1``).
* **lease**, ``pk = "lease#NN"``, ``sk = "lease"``: who works on the shard (``owner``, ``until`` epoch ms) and the
  timer's pass in progress (``pass_now`` epoch µs, ``pass_done``, the batch ``pass_pages`` / ``pass_written``),
  replayed as planned after a crash.

An entry is *live* when its ``rev`` equals its row's; a row write makes every older entry stale, so the timer drops
them. Shards spread the due index over ``SHARDS`` partition keys, so no partition takes a whole burst.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ...errors import InvalidScheduleError
from ...model import Headers
from ...schedules.model import MessageTemplate, Schedule, ScheduleState, definition_from_document

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

__all__ = [
    "DEFAULT_TABLE",
    "MAX_PAGE_BYTES",
    "MAX_PAGE_ENTRIES",
    "SHARDS",
    "DuePage",
    "Entry",
    "Row",
    "due_pk",
    "entry_of",
    "instant",
    "lease_pk",
    "merged",
    "micros",
    "minute_key",
    "minute_of_key",
    "page_bytes",
    "page_item",
    "page_of_item",
    "row_item",
    "row_of_item",
    "row_pk",
    "shard_of",
]

#: The table the CDK stack and ``delayed-delivery aws create`` use unless told otherwise.
DEFAULT_TABLE = "delayed-delivery-schedules"
#: Shards of the table: fixed, part of the format (a schedule's shard never changes).
SHARDS = 16
#: The most entries one due page holds, and its most bytes (DynamoDB items hold 400 KB).
MAX_PAGE_ENTRIES = 1000
MAX_PAGE_BYTES = 300_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MINUTE_DIGITS = 12

Item = dict[str, "AttributeValueTypeDef"]


def shard_of(schedule_id: str) -> int:
    """The shard of a schedule: the first 4 bytes of SHA-256 of its id (big-endian) modulo ``SHARDS``."""
    return int.from_bytes(hashlib.sha256(schedule_id.encode("utf-8")).digest()[:4], "big") % SHARDS


def row_pk(shard: int) -> str:
    """The partition key of a shard's rows."""
    return f"row#{shard:02d}"


def due_pk(shard: int) -> str:
    """The partition key of a shard's due pages."""
    return f"due#{shard:02d}"


def lease_pk(shard: int) -> str:
    """The partition key of a shard's lease."""
    return f"lease#{shard:02d}"


def micros(instant: datetime | None) -> int | None:
    """Epoch microseconds (None stays None)."""
    if instant is None:
        return None
    delta = instant - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def instant(value: object) -> datetime | None:
    """An instant from epoch microseconds (None stays None); ``ValueError`` for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"an instant is whole epoch microseconds, not {value!r}")
    return _EPOCH + timedelta(microseconds=value)


def minute_key(at: datetime) -> str:
    """The due page key prefix of the UTC minute holding ``at``: 12-digit epoch seconds of its start."""
    seconds = math.floor((at - _EPOCH).total_seconds() / 60) * 60
    return f"{max(0, seconds):0{_MINUTE_DIGITS}d}"


def minute_of_key(sk: str) -> datetime:
    """The minute a due page's sort key names."""
    head = sk.split("#", 1)[0]
    if len(head) != _MINUTE_DIGITS or not head.isdigit():
        raise ValueError(f"not a due page key: {sk[:60]!r}")
    return _EPOCH + timedelta(seconds=int(head))


def _compact(at: datetime | None) -> int | list[int] | None:
    """An instant in an entry: epoch seconds, or ``[seconds, microseconds]`` when it has a fraction."""
    if at is None:
        return None
    us = micros(at)
    assert us is not None
    seconds, fraction = divmod(us, 1_000_000)
    return seconds if not fraction else [seconds, fraction]


def _expanded(value: object) -> datetime | None:
    """The instant ``_compact`` wrote; ``ValueError`` for anything else."""
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                            for v in value) and 0 <= value[1] < 1_000_000:  # fmt: skip
        return instant(value[0] * 1_000_000 + value[1])
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"an entry's instant is epoch seconds or [seconds, microseconds], not {value!r}")
    return instant(value * 1_000_000)


@dataclass(frozen=True, slots=True)
class Entry:
    """A schedule's state in the due index since its row's write ``rev``.

    As JSON: ``[rev, version, cursor, next_at, fired, missed]``, then optionally ``last_fired`` (left out, or
    ``true``, when it is the cursor, as after every occurrence fired; ``false`` for none) and ``skipped_report``;
    instants as epoch seconds, or ``[seconds, microseconds]`` when they have a fraction (a cursor a pause set).
    """

    rev: int
    version: int
    cursor: datetime | None
    next_at: datetime | None
    fired: int
    missed: int
    last_fired: datetime | None
    #: Occurrences a resume counted ``skipped_paused``, for the timer to report once as a metric.
    skipped_report: int = 0

    def encoded(self) -> list[object]:
        """The JSON array form."""
        out: list[object] = [self.rev, self.version, _compact(self.cursor), _compact(self.next_at), self.fired,
                             self.missed]  # fmt: skip
        if self.skipped_report or self.last_fired != self.cursor:
            same = self.last_fired == self.cursor
            out.append(True if same else (False if self.last_fired is None else _compact(self.last_fired)))
        if self.skipped_report:
            out.append(self.skipped_report)
        return out

    @classmethod
    def decoded(cls, value: object) -> Entry:
        """From the JSON array; ``ValueError`` when it is not one this reads."""
        if not isinstance(value, list) or not 6 <= len(value) <= 8:
            raise ValueError("an entry is an array of 6 to 8 values")
        rev, ver, cur, nxt, fired, missed = value[:6]
        report = value[7] if len(value) == 8 else 0
        for n in (rev, ver, fired, missed, report):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"an entry's counts are whole numbers, not {n!r}")
        cursor = _expanded(cur)
        tail = value[6] if len(value) > 6 else True
        last = cursor if tail is True else None if tail is False else _expanded(tail)
        return cls(rev, ver, cursor, _expanded(nxt), fired, missed, last, report)


def entry_of(schedule: Schedule, rev: int, *, skipped_report: int = 0) -> Entry:
    """The entry holding ``schedule``'s cursor and counters under row write ``rev``."""
    return Entry(rev, schedule.version, schedule.cursor, schedule.next_at, schedule.fired, schedule.missed,
                 schedule.last_fired, skipped_report)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Row:
    """A schedule's row: the schedule as of the row's last write, and that write's ``rev``."""

    schedule: Schedule
    rev: int


def merged(row: Row, entry: Entry | None) -> Schedule:
    """The schedule now: its row, with the cursor and counters of its live entry (when ``entry`` is live)."""
    if entry is None or entry.rev != row.rev:
        return row.schedule
    return replace(
        row.schedule,
        version=entry.version,
        cursor=entry.cursor,
        next_at=entry.next_at,
        fired=entry.fired,
        missed=entry.missed,
        last_fired=entry.last_fired,
    )


def _n(value: int | None) -> AttributeValueTypeDef:
    return {"NULL": True} if value is None else {"N": str(value)}


def row_item(schedule: Schedule, rev: int) -> Item:
    """The row item of ``schedule`` written as ``rev``."""
    t = schedule.template
    return {
        "pk": {"S": row_pk(shard_of(schedule.schedule_id))},
        "sk": {"S": schedule.schedule_id},
        "rev": {"N": str(rev)},
        "ver": {"N": str(schedule.version)},
        "def": {"S": json.dumps(schedule.definition.document(), sort_keys=True, separators=(",", ":"))},
        "dest": {"S": t.destination},
        "body": {"B": t.body},
        "hdrs": {"S": t.headers_json()},
        "state": {"S": str(schedule.state)},
        "cur": _n(micros(schedule.cursor)),
        "nxt": _n(micros(schedule.next_at)),
        "fired": {"N": str(schedule.fired)},
        "missed": {"N": str(schedule.missed)},
        "skip": {"N": str(schedule.skipped_paused)},
        "paused": _n(micros(schedule.paused_at)),
        "last": _n(micros(schedule.last_fired)),
    }


def _int(item: Mapping[str, Any], name: str) -> int | None:
    value = item.get(name)
    if not isinstance(value, Mapping) or value.get("NULL"):
        return None
    text = value.get("N")
    if not isinstance(text, str) or not text.lstrip("-").isdigit() or len(text) > 20:
        raise ValueError(f"{name} is not a whole number")
    return int(text)


def _text(item: Mapping[str, Any], name: str) -> str:
    value = item.get(name)
    text = value.get("S") if isinstance(value, Mapping) else None
    if not isinstance(text, str):
        raise ValueError(f"{name} is not text")
    return text


def row_of_item(item: Mapping[str, Any]) -> Row:
    """The row an item holds; ``InvalidScheduleError`` (one line) when it cannot be read."""
    try:
        headers = json.loads(_text(item, "hdrs"))
        body = item.get("body", {}).get("B")
        if not isinstance(headers, dict) or not isinstance(body, bytes | bytearray):
            raise ValueError("headers are not an object or the body is not binary")
        schedule = Schedule(
            schedule_id=_text(item, "sk"),
            definition=definition_from_document(json.loads(_text(item, "def"))),
            template=MessageTemplate(_text(item, "dest"), bytes(body), Headers(headers)),
            state=ScheduleState(_text(item, "state")),
            cursor=instant(_int(item, "cur")),
            next_at=instant(_int(item, "nxt")),
            version=_int(item, "ver") or 0,
            fired=_int(item, "fired") or 0,
            missed=_int(item, "missed") or 0,
            skipped_paused=_int(item, "skip") or 0,
            paused_at=instant(_int(item, "paused")),
            last_fired=instant(_int(item, "last")),
        )
        return Row(schedule, _int(item, "rev") or 0)
    except InvalidScheduleError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise InvalidScheduleError(f"unreadable schedule row: {type(exc).__name__}: {exc}"[:300]) from None


@dataclass(frozen=True, slots=True)
class DuePage:
    """One due page: its shard, sort key, generation and entries (schedule id -> entry)."""

    shard: int
    sk: str
    generation: int
    entries: Mapping[str, Entry]
    #: Entries that could not be read: schedule id (or a placeholder) -> why (they are kept, never dropped).
    unreadable: Mapping[str, object] = field(default_factory=dict)

    @property
    def minute(self) -> datetime:
        """The minute the page is due in."""
        return minute_of_key(self.sk)


def page_item(
    shard: int, sk: str, generation: int, entries: Mapping[str, Entry], raw: Mapping[str, object] | None = None
) -> Item:
    """The item of a due page (``raw``: entries kept exactly as they were read: unreadable ones)."""
    body: dict[str, object] = {sid: entry.encoded() for sid, entry in entries.items()}
    body.update(raw or {})
    return {
        "pk": {"S": due_pk(shard)},
        "sk": {"S": sk},
        "g": {"N": str(generation)},
        "n": {"N": str(len(body))},
        "e": {"S": json.dumps(body, separators=(",", ":"), sort_keys=True)},
    }


def page_of_item(shard: int, item: Mapping[str, Any]) -> DuePage:
    """A due page from its item; an entry that cannot be read is kept aside in ``unreadable`` (never dropped)."""
    sk = _text(item, "sk")
    try:
        generation = _int(item, "g") or 0
        decoded = json.loads(_text(item, "e"))
        if not isinstance(decoded, dict):
            raise ValueError("entries are not an object")
    except (ValueError, TypeError) as exc:
        return DuePage(shard, sk, 0, {}, {"": f"unreadable page: {exc}"[:200]})
    entries: dict[str, Entry] = {}
    unreadable: dict[str, object] = {}
    for sid, value in decoded.items():
        try:
            entries[sid] = Entry.decoded(value)
        except ValueError:
            unreadable[sid] = value
    return DuePage(shard, sk, generation, entries, unreadable)


def page_bytes(entries: Mapping[str, Entry]) -> int:
    """About how many bytes ``entries`` take in a page."""
    return sum(len(sid) + 16 + len(json.dumps(e.encoded(), separators=(",", ":"))) for sid, e in entries.items())
