"""A recurring schedule as stored: its definition, message template, state, cursor and counters.

The **cursor** is the nominal instant of the last occurrence decided (written as a message, or recorded as missed
or skipped while paused): occurrences at or before it are never materialized again. ``next_at`` is the first
occurrence after the cursor (None once the schedule has ended), so a store finds due schedules by one index.
``version`` grows by one on every write; a write names the version it read (a conditional write).
The definition travels as a versioned JSON document (``definition_document``), the one format every store keeps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Any

from ..clock import utc
from ..errors import InvalidScheduleError
from ..headers import refuse_reserved
from ..model import Headers, check_destination
from ..validation import is_whole
from .catchup import CatchUp, CatchUpPolicy
from .days import DayMatch
from .dst import AUTO, parse_dst
from .occurrences import MAX_JITTER_SECONDS, check_schedule_id, utc_text
from .recurrence import Recurrence

__all__ = [
    "MessageTemplate",
    "Schedule",
    "ScheduleDefinition",
    "ScheduleState",
    "columns",
    "definition_from_document",
]

#: The version of the definition document written today (readers keep reading every older one).
DEFINITION_VERSION = 1
#: The largest message body a schedule carries (the stores' own limits may be lower).
MAX_TEMPLATE_BODY = 256 * 1024


class ScheduleState(StrEnum):
    """Whether the materializer writes a schedule's occurrences."""

    ACTIVE = "active"
    PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class ScheduleDefinition:
    """What fires when: expression, zone, DST and day rules, ``[start, end)``, jitter and catch-up."""

    expression: str
    start: datetime
    zone: str = "UTC"
    dst: str = AUTO
    day_match: DayMatch = DayMatch.OR
    end: datetime | None = None
    jitter_seconds: int = 0
    catch_up: CatchUp = field(default_factory=CatchUp)

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", utc(self.start))
        if self.end is not None:
            object.__setattr__(self, "end", utc(self.end))
            if self.end <= self.start:
                raise InvalidScheduleError(f"a schedule's end {self.end.isoformat()} is not after its start")
        object.__setattr__(self, "dst", str(parse_dst(self.dst)))
        object.__setattr__(self, "day_match", DayMatch(self.day_match))
        if not is_whole(self.jitter_seconds, 0, MAX_JITTER_SECONDS):
            raise InvalidScheduleError(f"jitter must be whole seconds from 0 to {MAX_JITTER_SECONDS:,}")
        self.recurrence()  # refuses what cannot be evaluated, in one line

    def recurrence(self) -> Recurrence:
        """The evaluator (a rate's anchor is ``start``); one per distinct definition, built once and shared.

        Only a rate depends on its anchor: cron and ``at`` schedules created at different times share one evaluator
        (100,000 schedules of ``0 9 * * *`` in five zones build five).
        """
        rate = self.expression.lstrip()[:4].lower() == "rate"
        return _recurrence(self.expression, self.zone, self.dst, self.day_match, self.start if rate else None)

    def document(self) -> dict[str, Any]:
        """The definition as its JSON document (version ``DEFINITION_VERSION``)."""
        return {
            "v": DEFINITION_VERSION,
            "expression": self.expression,
            "zone": self.zone,
            "dst": self.dst,
            "day_match": str(self.day_match),
            "start": _text(self.start),
            "end": None if self.end is None else _text(self.end),
            "jitter_s": self.jitter_seconds,
            "catch_up": {
                "policy": str(self.catch_up.policy),
                "window_s": self.catch_up.window_seconds,
                "limit": self.catch_up.limit,
            },
        }


@lru_cache(maxsize=4096)
def _recurrence(expression: str, zone: str, dst: str, day_match: DayMatch, start: datetime | None) -> Recurrence:
    """A compiled evaluator (immutable once built: its day sets are remembered under a lock-free cache)."""
    return Recurrence(expression, zone, dst=dst, day_match=day_match, anchor=start)


def definition_from_document(document: Mapping[str, Any]) -> ScheduleDefinition:
    """A definition from its JSON document (every version ever written); ``InvalidScheduleError`` if unreadable."""
    try:
        if document.get("v") != 1:
            raise InvalidScheduleError(f"schedule definition version {document.get('v')!r} is not one this reads")
        catch_up = document["catch_up"]
        return ScheduleDefinition(
            expression=str(document["expression"]),
            start=_instant(document["start"]),
            zone=str(document["zone"]),
            dst=str(document["dst"]),
            day_match=DayMatch(document["day_match"]),
            end=None if document.get("end") is None else _instant(document["end"]),
            jitter_seconds=document["jitter_s"],
            catch_up=CatchUp(CatchUpPolicy(catch_up["policy"]), catch_up["window_s"], catch_up["limit"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidScheduleError(f"unreadable schedule definition: {type(exc).__name__}: {exc}") from None


def _text(instant: datetime) -> str:
    """``YYYY-MM-DDThh:mm:ssZ``, with microseconds when it has any."""
    return utc_text(instant) if not instant.microsecond else instant.isoformat().replace("+00:00", "Z")


def _instant(text: object) -> datetime:
    if not isinstance(text, str):
        raise TypeError(f"an instant is ISO-8601 text, not {type(text).__name__}")
    return utc(datetime.fromisoformat(text))


@dataclass(frozen=True, slots=True)
class MessageTemplate:
    """What each occurrence delivers: destination, body and headers (the ``DelayedDelivery.`` prefix is ours)."""

    destination: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=Headers)

    def __post_init__(self) -> None:
        check_destination(self.destination)
        if not isinstance(self.body, bytes):
            raise InvalidScheduleError("a schedule's message body must be bytes")
        if len(self.body) > MAX_TEMPLATE_BODY:
            raise InvalidScheduleError(f"a schedule's message body is at most {MAX_TEMPLATE_BODY:,} bytes")
        refuse_reserved(self.headers)
        object.__setattr__(self, "headers", Headers(self.headers))

    def headers_json(self) -> str:
        """The headers as a JSON object (what stores keep)."""
        return json.dumps(dict(self.headers), ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A stored schedule. Build a new one with ``Schedule.new``; every write goes through ``next_version``."""

    schedule_id: str
    definition: ScheduleDefinition
    template: MessageTemplate
    state: ScheduleState = ScheduleState.ACTIVE
    cursor: datetime | None = None
    next_at: datetime | None = None
    version: int = 1
    fired: int = 0
    missed: int = 0
    skipped_paused: int = 0
    paused_at: datetime | None = None
    last_fired: datetime | None = None

    def __post_init__(self) -> None:
        check_schedule_id(self.schedule_id)
        for name in ("cursor", "next_at", "paused_at", "last_fired"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, utc(value))

    @classmethod
    def new(cls, schedule_id: str, definition: ScheduleDefinition, template: MessageTemplate) -> Schedule:
        """A schedule that has materialized nothing yet: ``next_at`` is its first occurrence at or after start."""
        first = next(iter(definition.recurrence().fires(definition.start, definition.end)), None)
        return cls(schedule_id, definition, template, next_at=None if first is None else first.nominal)

    @property
    def ended(self) -> bool:
        """No occurrence is left after the cursor."""
        return self.next_at is None

    def next_version(self, **changes: Any) -> Schedule:
        """A copy with ``changes`` and the version after this one (what a conditional write stores)."""
        return replace(self, version=self.version + 1, **changes)

    def following(self, recurrence: Recurrence, cursor: datetime | None) -> datetime | None:
        """The first occurrence after ``cursor`` (from start when None) and before the end, or None."""
        begin = self.definition.start if cursor is None else cursor + timedelta(microseconds=1)
        first = next(iter(recurrence.fires(begin, self.definition.end)), None)
        return None if first is None else first.nominal


def columns(s: Schedule, instant: Callable[[datetime | None], object]) -> tuple[object, ...]:
    """What the SQL stores keep of a schedule, in their column order (``instant``: how the store keeps instants):
    id, definition document, destination, body, headers, state, cursor, next_at, version, fired, missed,
    skipped_paused, paused_at, last_fired."""
    t = s.template
    return (
        s.schedule_id,
        json.dumps(s.definition.document(), sort_keys=True),
        t.destination,
        t.body,
        t.headers_json(),
        str(s.state),
        instant(s.cursor),
        instant(s.next_at),
        s.version,
        s.fired,
        s.missed,
        s.skipped_paused,
        instant(s.paused_at),
        instant(s.last_fired),
    )
