"""Occurrence ids and deterministic jitter.

An occurrence's message id is ``<schedule-id>@<nominal instant as YYYY-MM-DDThh:mm:ssZ>``; jitter never changes it.
Jitter: ``fire = nominal + (first 8 bytes of SHA-256(id) as a big-endian integer) mod (J' + 1)`` seconds with
``J' = min(max_jitter, next nominal - nominal - 1 s)``, none when ``J' <= 0``: the same occurrence always fires at
the same second, and never at or after the next one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..clock import utc
from ..errors import InvalidScheduleError
from ..validation import is_whole
from .recurrence import Fire, Recurrence

__all__ = [
    "MAX_JITTER_SECONDS",
    "MAX_SCHEDULE_ID_LENGTH",
    "Occurrence",
    "check_schedule_id",
    "expand",
    "fire_at",
    "jitter_seconds",
    "occurrence_id",
    "occurrence_of",
    "parse_occurrence_id",
    "utc_text",
]

#: Longest schedule id: its occurrence ids (id + ``@`` + 20 characters) stay within the 128 a message id may have.
MAX_SCHEDULE_ID_LENGTH = 100
#: The longest jitter a schedule may ask for: one day.
MAX_JITTER_SECONDS = 86_400
_SCHEDULE_ID = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{MAX_SCHEDULE_ID_LENGTH - 1}}}$")
_OCCURRENCE = re.compile(r"^(?P<sid>.+)@(?P<at>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)$")


def check_schedule_id(schedule_id: object) -> str:
    """A schedule id: 1-100 ASCII letters, digits, ``_ . : -``, starting with a letter or digit."""
    if not isinstance(schedule_id, str) or _SCHEDULE_ID.match(schedule_id) is None:
        raise InvalidScheduleError(
            f"schedule id {str(schedule_id)[:120]!r}: use 1-{MAX_SCHEDULE_ID_LENGTH} ASCII letters, digits, '_', '.', "
            "':' or '-', starting with a letter or digit"
        )
    return schedule_id


def utc_text(instant: datetime) -> str:
    """``YYYY-MM-DDThh:mm:ssZ``."""
    return utc(instant).strftime("%Y-%m-%dT%H:%M:%SZ")


def occurrence_id(schedule_id: str, nominal: datetime) -> str:
    """``<schedule-id>@<nominal instant, UTC, whole seconds, Z>``."""
    return f"{check_schedule_id(schedule_id)}@{utc_text(nominal)}"


def parse_occurrence_id(text: str) -> tuple[str, datetime]:
    """The schedule id and nominal instant an occurrence id names."""
    match = _OCCURRENCE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidScheduleError(f"{str(text)[:140]!r} is not an occurrence id (<schedule-id>@YYYY-MM-DDThh:mm:ssZ)")
    try:
        nominal = datetime.fromisoformat(match.group("at"))
    except ValueError:
        raise InvalidScheduleError(f"{text[:140]!r} names no valid instant") from None
    return check_schedule_id(match.group("sid")), nominal


def jitter_seconds(occurrence: str, nominal: datetime, next_nominal: datetime | None, max_jitter: int) -> int:
    """The whole seconds the occurrence ``occurrence`` (its id) fires after ``nominal``."""
    if not is_whole(max_jitter, 0, MAX_JITTER_SECONDS):
        raise InvalidScheduleError(f"jitter must be whole seconds from 0 to {MAX_JITTER_SECONDS:,}, got {max_jitter!r}")
    cap = max_jitter
    if next_nominal is not None:
        cap = min(cap, int((utc(next_nominal) - utc(nominal)).total_seconds()) - 1)
    if cap <= 0:
        return 0
    digest = hashlib.sha256(occurrence.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % (cap + 1)


def fire_at(occurrence: str, nominal: datetime, next_nominal: datetime | None, max_jitter: int) -> datetime:
    """When the occurrence fires: its nominal instant plus its jitter."""
    return utc(nominal) + timedelta(seconds=jitter_seconds(occurrence, nominal, next_nominal, max_jitter))


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence: its id (None without a schedule id), nominal instant, fire time, local time and DST note."""

    id: str | None
    nominal: datetime
    fire_at: datetime
    local: datetime
    note: str | None = None


def expand(
    recurrence: Recurrence,
    start: datetime,
    end: datetime | None = None,
    *,
    schedule_id: str | None = None,
    max_jitter: int = 0,
) -> Iterator[Occurrence]:
    """The occurrences with nominal instants in ``[start, end)``, with ids and jitter (none without a schedule id)."""
    fires = recurrence.fires(start)
    stop = utc(end) if end is not None else None
    current = next(fires, None)
    while current is not None and (stop is None or current.nominal < stop):
        following = next(fires, None)
        yield occurrence_of(current, following, schedule_id, max_jitter)
        current = following


def occurrence_of(fire: Fire, following: Fire | None, schedule_id: str | None, max_jitter: int) -> Occurrence:
    """``fire`` as an occurrence: its id (None without a schedule id) and its jittered fire time."""
    if schedule_id is None:
        if max_jitter:
            raise InvalidScheduleError("jitter needs a schedule id: it is computed from the occurrence id")
        return Occurrence(None, fire.nominal, fire.nominal, fire.local, fire.note)
    oid = occurrence_id(schedule_id, fire.nominal)
    nxt = following.nominal if following is not None else None
    return Occurrence(oid, fire.nominal, fire_at(oid, fire.nominal, nxt, max_jitter), fire.local, fire.note)
