"""Row design of the Azure schedules table (format 1): a schedule's row and its due row, written and read back.

The table is the endpoint's own (``DELAYED_DELIVERY_SCHEDULE_TABLE_NAME``, default the delays table's name plus
``sched``). A schedule belongs to one of ``SHARDS`` (16) partitions, ``PartitionKey = "s" + 2-digit shard``, the
shard being the first 4 bytes of SHA-256 of its id modulo 16. A partition holds two kinds of row:

* the schedule's row, ``RowKey = "r_" + schedule id`` (ids are ASCII letters, digits and ``_ . : -``, all legal in
  a key): ``Format`` (1), ``Version`` (Int64), ``Definition`` (the definition's JSON document), ``Destination``,
  ``Headers`` (JSON), ``BodyChunks`` and ``Body00``… (binary, at most 64 KiB each), ``State`` (``active`` or
  ``paused``), the instants ``Cursor``, ``NextAt``, ``PausedAt``, ``LastFired`` (20-digit UTC
  ``YYYYMMDDhhmmssffffff``, "" for none), the counters ``Fired``, ``Missed``, ``SkippedPaused`` (Int64) and
  ``SkippedReported`` (Int64: how much of ``SkippedPaused`` a timer run has reported as its ``skipped_paused``
  metric; a row written before it had none reads as all reported);
* its due row while it is active and has a next occurrence, ``RowKey = "n_" + NextAt + "_" + schedule id``:
  ``ScheduleId`` and ``Version``. "Everything due by T" is the key range ``"n_" <= RowKey < "n_" + key(T + 1 µs)``
  inside each partition, so a pass reads only what is due.

Both rows of a schedule change together in one entity-group transaction, conditional on the schedule row's ETag.
A reader checks every property (type, size, range) and refuses a row it cannot read with ``InvalidScheduleError``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from azure.data.tables import EdmType, EntityProperty

from ...errors import InvalidScheduleError
from ...jsonbounds import loads_bounded, parse_headers_json
from ...model import Headers
from ...schedules.model import (
    MAX_TEMPLATE_BODY,
    MessageTemplate,
    Schedule,
    ScheduleState,
    definition_from_document,
)
from ...schedules.occurrences import check_schedule_id
from ...validation import is_whole
from ..rows import CHUNK_BYTES, due_key, from_due_key

__all__ = [
    "DUE_END",
    "DUE_PREFIX",
    "FORMAT",
    "ROW_END",
    "ROW_PREFIX",
    "SHARDS",
    "due_bound",
    "due_entity",
    "due_row_key",
    "number",
    "partition_key",
    "partition_of",
    "reported_of",
    "row_key",
    "schedule_entity",
    "schedule_of",
    "shard_of",
]

FORMAT = 1
SHARDS = 16
ROW_PREFIX = "r_"
#: One character after ``_``: ``"r_" <= RowKey < "r`"`` selects every schedule row.
ROW_END = "r`"
DUE_PREFIX = "n_"
DUE_END = "n`"
#: The longest definition document read back (an expression is at most 1,000 characters).
_MAX_DEFINITION_CHARS = 8 * 1024
_MAX_HEADERS_CHARS = 32 * 1024
_MAX_CHUNKS = -(-MAX_TEMPLATE_BODY // CHUNK_BYTES)
_INSTANTS = {"Cursor": "cursor", "NextAt": "next_at", "PausedAt": "paused_at", "LastFired": "last_fired"}
_COUNTERS = {"Fired": "fired", "Missed": "missed", "SkippedPaused": "skipped_paused"}
_MAX_COUNT = 2**62


def shard_of(schedule_id: str) -> int:
    """The schedule's shard: the first 4 bytes of SHA-256 of its id, modulo ``SHARDS``."""
    return int.from_bytes(hashlib.sha256(schedule_id.encode("utf-8")).digest()[:4], "big") % SHARDS


def partition_of(schedule_id: str) -> str:
    """``s00`` … ``s15``."""
    return partition_key(shard_of(schedule_id))


def partition_key(shard: int) -> str:
    """The partition of ``shard``."""
    return f"s{shard:02d}"


def row_key(schedule_id: str) -> str:
    """The RowKey of a schedule's row."""
    return ROW_PREFIX + schedule_id


def due_row_key(schedule: Schedule) -> str | None:
    """The RowKey of the schedule's due row, or None when it has none (paused, or ended)."""
    if schedule.state is not ScheduleState.ACTIVE or schedule.next_at is None:
        return None
    return f"{DUE_PREFIX}{due_key(schedule.next_at)}_{schedule.schedule_id}"


def due_bound(horizon: datetime) -> str:
    """The exclusive upper RowKey of the due rows at or before ``horizon`` (```` ` ```` sorts just after ``_``)."""
    return f"{DUE_PREFIX}{due_key(horizon)}`"


def _instant(value: datetime | None) -> str:
    return "" if value is None else due_key(value)


def schedule_entity(schedule: Schedule, skipped_reported: int | None = None) -> dict[str, Any]:
    """The schedule's row (``skipped_reported``: None for all of ``skipped_paused``)."""
    t = schedule.template
    chunks = [t.body[i : i + CHUNK_BYTES] for i in range(0, len(t.body), CHUNK_BYTES)]
    entity: dict[str, Any] = {
        "PartitionKey": partition_of(schedule.schedule_id),
        "RowKey": row_key(schedule.schedule_id),
        "Format": FORMAT,
        "Version": _int64(schedule.version),
        "Definition": json.dumps(schedule.definition.document(), sort_keys=True, ensure_ascii=False),
        "Destination": t.destination,
        "Headers": t.headers_json(),
        "State": str(schedule.state),
        "BodyChunks": len(chunks),
    }
    for i, chunk in enumerate(chunks):
        entity[f"Body{i:02d}"] = chunk
    for prop, name in _INSTANTS.items():
        entity[prop] = _instant(getattr(schedule, name))
    for prop, name in _COUNTERS.items():
        entity[prop] = _int64(getattr(schedule, name))
    reported = schedule.skipped_paused if skipped_reported is None else skipped_reported
    entity["SkippedReported"] = _int64(min(max(0, reported), schedule.skipped_paused))
    return entity


def due_entity(schedule: Schedule) -> dict[str, Any] | None:
    """The schedule's due row, or None when it has none."""
    key = due_row_key(schedule)
    if key is None:
        return None
    return {
        "PartitionKey": partition_of(schedule.schedule_id),
        "RowKey": key,
        "ScheduleId": schedule.schedule_id,
        "Version": _int64(schedule.version),
    }


def _int64(value: int) -> EntityProperty:
    """An Int64 property (versions and counters grow past 2^31 in time)."""
    return EntityProperty(value, EdmType.INT64)


def schedule_of(entity: Mapping[str, Any]) -> Schedule:
    """The schedule a row holds; ``InvalidScheduleError`` (one line) when the row is not a readable format-1 row."""
    try:
        return _read(entity)
    except InvalidScheduleError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        key = str(entity.get("RowKey", "?"))[:120]
        raise InvalidScheduleError(f"unreadable schedule row {key!r}: {type(exc).__name__}: {exc}"[:300]) from None


def _read(entity: Mapping[str, Any]) -> Schedule:
    if entity.get("Format") != FORMAT:
        raise ValueError(f"format {entity.get('Format')!r} is not one this reads")
    rk = entity["RowKey"]
    if not isinstance(rk, str) or not rk.startswith(ROW_PREFIX):
        raise ValueError("not a schedule row")
    schedule_id = check_schedule_id(rk[len(ROW_PREFIX) :])
    definition = _text(entity, "Definition", _MAX_DEFINITION_CHARS)
    document = loads_bounded(definition, what="schedule definition", max_chars=_MAX_DEFINITION_CHARS, max_depth=3)
    if not isinstance(document, dict):
        raise TypeError("the definition is not a JSON object")
    chunks = entity.get("BodyChunks")
    if not is_whole(chunks, 0, _MAX_CHUNKS):
        raise ValueError(f"BodyChunks is {chunks!r}, not a count from 0 to {_MAX_CHUNKS}")
    parts: list[bytes] = []
    for i in range(chunks):
        part = entity.get(f"Body{i:02d}")
        if not isinstance(part, bytes) or len(part) > CHUNK_BYTES:
            raise ValueError(f"the body chunks do not match BodyChunks={chunks}")
        parts.append(part)
    if f"Body{chunks:02d}" in entity:
        raise ValueError(f"the body chunks do not match BodyChunks={chunks}")
    headers = parse_headers_json(_text(entity, "Headers", _MAX_HEADERS_CHARS), max_chars=_MAX_HEADERS_CHARS)
    template = MessageTemplate(_text(entity, "Destination", 260), b"".join(parts), Headers(headers))
    values: dict[str, Any] = {}
    for prop, name in _INSTANTS.items():
        text = _text(entity, prop, 20)
        values[name] = from_due_key(text) if text else None
    for prop, name in (*_COUNTERS.items(), ("Version", "version")):
        value = number(entity.get(prop))
        if not is_whole(value, 1 if name == "version" else 0, _MAX_COUNT):
            raise ValueError(f"{prop} is {value!r}, not a count")
        values[name] = value
    return Schedule(
        schedule_id=schedule_id,
        definition=definition_from_document(document),
        template=template,
        state=ScheduleState(_text(entity, "State", 10)),
        **values,
    )


def reported_of(entity: Mapping[str, Any]) -> int:
    """How much of the row's ``SkippedPaused`` a timer has reported (none recorded, or unreadable: all of it)."""
    skipped, reported = number(entity.get("SkippedPaused")), number(entity.get("SkippedReported"))
    if not is_whole(skipped, 0, _MAX_COUNT):
        return 0
    return reported if is_whole(reported, 0, skipped) else skipped


def number(value: Any) -> Any:
    """An Int32/Int64 property's value (the SDK hands back Int64 as an ``EntityProperty``)."""
    return getattr(value, "value", value)


def _text(entity: Mapping[str, Any], name: str, limit: int) -> str:
    value = entity[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} is {type(value).__name__}, not text")
    if len(value) > limit:
        raise ValueError(f"{name} is longer than {limit:,} characters")
    return value
