"""Row design of the delays table: keys, properties, body chunks and the entity size limit.

Every shard is one partition, ``PartitionKey = "s" + 3-digit shard``. It holds two kinds of row:

* due rows, ``RowKey = "d_" + due time + "_" + SHA-1(message id)``. The due time is UTC, zero-padded,
  culture-invariant ``YYYYMMDDhhmmssffffff`` (20 digits), so the RowKey order is the due order and
  "everything due at T" is the range ``"d_" <= RowKey < "d_" + key(T + 1 µs)`` inside one partition.
  The service seeks to the start of that range and stops at its end: rows due later are never read,
  whether there are ten of them or ten million.
* index rows, ``RowKey = "i_" + SHA-1(message id)``, pointing at the message's due row. They let
  ``remove``, ``reschedule`` and re-``store`` find a message by id. A message's index row and due row
  share a partition, so both are written in one entity-group transaction (never one without the other).

Due-row properties: ``MessageId``, ``Destination``, ``Headers`` (JSON), ``FailureCount`` (Int32),
``AvailableAt`` (same 20-digit format: the claim; a row is fetchable when ``AvailableAt <= now``),
``ClaimToken`` (the claim's token while a dispatcher holds the row, else empty or missing),
``BodyChunks`` (Int32) and ``Body00``, ``Body01``, … binary properties of at most 64 KiB each.
A dispatcher's claim also writes ``Sending`` (its token) on a row that carries none, before any put: from then on a copy
may be on its queue that no outcome records, so operators are refused until the row is delivered and removed. Only
giving the row back unsent (release control's deferral) restores the value the claim found; a row read back without
the property that holds a ``ClaimToken`` (claimed before the mark existed, not placed) counts as marked.
A row release control keeps back until its release slot (``deferred_entities``) is keyed by the slot instead of
the due time, so it is read only once its slot has come, and carries ``DueAt`` (the message's own due time, same
20-digit format); a reader that does not know ``DueAt`` sees the slot as the due time.
The entity, counted as the service counts it, must stay within 1 MiB; beyond that the message is
refused with ``InvalidMessageError`` before anything is written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..clock import utc
from ..errors import ConfigurationError, InvalidMessageError
from ..jsonbounds import parse_headers_json
from ..model import DelayedMessage, Headers, is_usable_message_id
from ..model import unreadable_message as unreadable
from ..validation import is_whole

__all__ = [
    "CHUNK_BYTES",
    "MAX_ENTITY_BYTES",
    "DueRow",
    "body_capacity",
    "deferred_entities",
    "deferred_slot",
    "due_key",
    "due_range",
    "due_row_key",
    "entity_size",
    "from_due_key",
    "id_hash",
    "index_row_key",
    "legacy_mark",
    "maybe_sent",
    "message_from_entity",
    "partition_key",
    "placed_patch",
    "placing_mark",
    "sending_mark",
    "shard_of",
    "stored_size",
    "to_entities",
    "unreadable_message",
]

#: Largest binary or string property the Table service stores.
CHUNK_BYTES = 64 * 1024
#: Largest entity the Table service stores.
MAX_ENTITY_BYTES = 1024 * 1024
#: Most shards a table supports (3-digit partition keys).
MAX_SHARDS = 1000
DUE_PREFIX = "d_"
#: A deferred row's own due time (its RowKey holds its release slot).
DUE_AT = "DueAt"
INDEX_PREFIX = "i_"
#: ``AvailableAt`` of a row placed on its queue ahead of its due time (``placement.py``): never fetched again.
PLACED_KEY = "99991231235959999999"
#: A placed row's queue message id and pop receipt (what deletes or updates the hidden message).
QUEUE_MESSAGE_ID = "QueueMessageId"
POP_RECEIPT = "PopReceipt"
#: The claim token of a placement begun (written with the placer's claim, before its put) and not confirmed by its
#: own record: a copy may wait on the queue that the row does not name, so operators are refused while it is set.
#: Cleared only by the record (or give-back) of the placement that set it; a later claim never overwrites it.
PLACING = "Placing"
#: The token of the dispatcher's claim that first took the row for sending (written with the claim, before any put) and
#: not followed by a recorded outcome: a copy may be on its queue, so operators are refused while it is set. Later
#: claims keep it; only giving the row back unsent restores what its claim found. Cleared in effect by the removal.
SENDING = "Sending"
#: The due row's claim token property (``table_gateway.CLAIM``).
_CLAIM = "ClaimToken"
#: One character after ``_``: ``"d_" <= RowKey < "d`"`` selects every due row.
DUE_END = "d`"
_KEY_LEN = 20


def due_key(when: datetime) -> str:
    """``YYYYMMDDhhmmssffffff`` in UTC, built from integers (no locale, no strftime)."""
    t = utc(when)
    return f"{t.year:04d}{t.month:02d}{t.day:02d}{t.hour:02d}{t.minute:02d}{t.second:02d}{t.microsecond:06d}"


def from_due_key(key: str) -> datetime:
    """Inverse of ``due_key``."""
    if len(key) != _KEY_LEN or not key.isdigit():
        raise ValueError(f"not a due key: {key!r}")
    return datetime(
        int(key[0:4]),
        int(key[4:6]),
        int(key[6:8]),
        int(key[8:10]),
        int(key[10:12]),
        int(key[12:14]),
        int(key[14:20]),
        tzinfo=UTC,
    )


def id_hash(message_id: str) -> str:
    """Lowercase hex SHA-1 of the UTF-8 message id: safe in keys whatever characters the id uses."""
    return hashlib.sha1(message_id.encode("utf-8"), usedforsecurity=False).hexdigest()


def shard_of(message_id: str, shards: int) -> int:
    """The shard a message id belongs to (stable across processes and restarts)."""
    return int(id_hash(message_id)[:8], 16) % shards


def partition_key(shard: int) -> str:
    """``s000``, ``s001``, …"""
    if not 0 <= shard < MAX_SHARDS:
        raise ConfigurationError(f"shard must be between 0 and {MAX_SHARDS - 1}, got {shard}")
    return f"s{shard:03d}"


def due_row_key(due_at: datetime, message_id: str) -> str:
    """RowKey of a due row."""
    return f"{DUE_PREFIX}{due_key(due_at)}_{id_hash(message_id)}"


def index_row_key(message_id: str) -> str:
    """RowKey of a message's index row."""
    return INDEX_PREFIX + id_hash(message_id)


def due_range(at: datetime) -> tuple[str, str]:
    """``(lo, hi)`` such that due rows with ``lo <= RowKey < hi`` are exactly those due at or before ``at``."""
    return DUE_PREFIX, DUE_PREFIX + due_key(utc(at) + timedelta(microseconds=1))


def due_of_row_key(row_key: str) -> datetime:
    """The due time encoded in a due row's RowKey."""
    return from_due_key(row_key[len(DUE_PREFIX) : len(DUE_PREFIX) + _KEY_LEN])


def _str_size(value: str) -> int:
    return 4 + len(value.encode("utf-16-le"))


def _prop_size(name: str, value: Any) -> int:
    size = 8 + 2 * len(name)
    if isinstance(value, bytes):
        return size + 4 + len(value)
    if isinstance(value, str):
        return size + _str_size(value)
    return size + 8


def entity_size(entity: Mapping[str, Any]) -> int:
    """Size of ``entity`` as the Table service counts it (4 + keys as UTF-16 + per-property overhead)."""
    pk, rk = str(entity["PartitionKey"]), str(entity["RowKey"])
    size = 4 + len((pk + rk).encode("utf-16-le"))
    for name, value in entity.items():
        if name not in ("PartitionKey", "RowKey"):
            size += _prop_size(name, value)
    return size


def wire_size(entity: Mapping[str, Any]) -> int:
    """Bytes of the entity as the JSON request body (binary as base64 with its type annotation)."""
    size = 2
    for name, value in entity.items():
        if isinstance(value, bytes):
            size += len(name) + 6 + (len(value) + 2) // 3 * 4
            size += len(name) + len('"@odata.type":"Edm.Binary",') + 1
        elif isinstance(value, str):
            size += len(name) + 6 + len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
        else:
            size += len(name) + 6 + 20 + len(name) + len('"@odata.type":"Edm.Int64",')
    return size


#: Room left for what the SDK adds to the request body (odata annotations, separators).
_WIRE_SLACK = 1024


def stored_size(entity: Mapping[str, Any]) -> int:
    """The size the Table service (counting properties) and Azurite (counting the JSON body) would see."""
    return max(entity_size(entity), wire_size(entity) + _WIRE_SLACK)


@dataclass(frozen=True, slots=True)
class DueRow:
    """A due row read back from the table, with its ETag for conditional updates."""

    partition_key: str
    row_key: str
    etag: str
    available_at: str
    message: DelayedMessage
    #: The release slot the row was deferred to (``deferred_entities``), or None.
    slot: datetime | None = None
    #: The ``Sending`` mark the row carried when it was read (an earlier claim's; "" when none).
    sending: str = ""


def to_entities(message: DelayedMessage, shard: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(due_row, index_row)`` for ``message``; ``InvalidMessageError`` when it cannot fit one entity."""
    due = _due_entity(message, shard)
    size = stored_size(due)
    if size > MAX_ENTITY_BYTES:
        raise InvalidMessageError(
            f"message {message.message_id!r} needs a {size}-byte table entity (body {len(message.body)} bytes); "
            f"the Table service stores at most {MAX_ENTITY_BYTES} bytes per entity: keep the body within "
            f"{body_capacity(message)} bytes"
        )
    index = {
        "PartitionKey": due["PartitionKey"],
        "RowKey": index_row_key(message.message_id),
        "DueRowKey": due["RowKey"],
    }
    return due, index


def _due_entity(message: DelayedMessage, shard: int) -> dict[str, Any]:
    pk = partition_key(shard)
    rk = due_row_key(message.due_at, message.message_id)
    headers = json.dumps(dict(message.headers), ensure_ascii=False, separators=(",", ":"))
    if len(headers.encode("utf-16-le")) > CHUNK_BYTES:
        raise InvalidMessageError(
            f"message {message.message_id!r}: headers take {len(headers)} characters as JSON; "
            f"the Table service stores at most {CHUNK_BYTES // 2} characters in one property"
        )
    body = message.body
    chunks = [body[i : i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)]
    due: dict[str, Any] = {
        "PartitionKey": pk,
        "RowKey": rk,
        "MessageId": message.message_id,
        "Destination": message.destination,
        "Headers": headers,
        "FailureCount": message.failure_count,
        "AvailableAt": due_key(message.due_at),
        "BodyChunks": len(chunks),
    }
    for i, chunk in enumerate(chunks):
        due[f"Body{i:02d}"] = chunk
    return due


def deferred_entities(message: DelayedMessage, shard: int, slot: datetime) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(due_row, index_row)`` of ``message`` kept back until ``slot``: keyed by the slot, due time in ``DueAt``."""
    at_slot = DelayedMessage(
        message.message_id, message.destination, message.body, slot, message.headers, message.failure_count
    )
    due, index = to_entities(at_slot, shard)
    due[DUE_AT] = due_key(message.due_at)
    size = stored_size(due)
    if size > MAX_ENTITY_BYTES:
        raise InvalidMessageError(f"message {message.message_id!r} cannot be kept back: a {size}-byte entity")
    return due, index


def placing_mark(token: str) -> dict[str, Any]:
    """What a placer's claim writes besides the claim (before its put): the ``Placing`` mark, ``""`` to clear it."""
    return {PLACING: token}


def sending_mark(token: str) -> dict[str, Any]:
    """What a dispatcher's claim writes besides the claim on a row without a mark: the ``Sending`` mark (its token)."""
    return {SENDING: token}


def maybe_sent(row: Mapping[str, Any]) -> bool:
    """Whether a dispatcher may have put ``row``'s message on its queue with no outcome recorded: its ``Sending`` mark,
    or (a row claimed before the mark existed) a claim token on a row neither placed nor being placed."""
    if row.get(SENDING):
        return True
    legacy = SENDING not in row and bool(row.get(_CLAIM)) and not row.get(PLACING)
    return legacy and row.get("AvailableAt") != PLACED_KEY


def legacy_mark(row: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Sending`` mark a row claimed before the mark existed stands for (its claim token), to write when its claim
    is cleared (``reshard``); nothing for any other row."""
    return sending_mark(str(row[_CLAIM])) if maybe_sent(row) and not row.get(SENDING) else {}


def placed_patch(partition: str, row_key: str, queue_message_id: str, pop_receipt: str) -> dict[str, Any]:
    """The merge that marks a due row placed on its queue (``placement.py``): never fetched again, swept after due."""
    return {
        "PartitionKey": partition,
        "RowKey": row_key,
        "AvailableAt": PLACED_KEY,
        QUEUE_MESSAGE_ID: queue_message_id,
        POP_RECEIPT: pop_receipt,
    }


def deferred_slot(entity: Mapping[str, Any]) -> datetime | None:
    """The release slot a row was deferred to (its RowKey's time when it carries ``DueAt``), or None."""
    own = entity.get(DUE_AT)
    if not isinstance(own, str) or len(own) != _KEY_LEN or not own.isdigit():
        return None
    slot = due_of_row_key(str(entity["RowKey"]))
    return slot if slot > from_due_key(own) else None


def body_capacity(message: DelayedMessage) -> int:
    """Largest body that fits one entity together with ``message``'s id, destination and headers."""
    lo, hi = 0, MAX_ENTITY_BYTES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        probe = DelayedMessage(message.message_id, message.destination, bytes(mid), message.due_at, message.headers)
        if stored_size(_due_entity(probe, 0)) <= MAX_ENTITY_BYTES:
            lo = mid
        else:
            hi = mid - 1
    return lo


def message_from_entity(entity: Mapping[str, Any]) -> DelayedMessage:
    """Rebuild the message stored in a due row (``ValueError``/``KeyError``/``TypeError`` when it is garbage)."""
    chunks = entity.get("BodyChunks", 0)
    if not is_whole(chunks):
        raise TypeError(f"BodyChunks is {chunks!r}, not a count")
    parts = [entity[f"Body{i:02d}"] for i in range(chunks)]
    if any(not isinstance(part, bytes) for part in parts) or f"Body{chunks:02d}" in entity:
        raise ValueError(f"the body chunks do not match BodyChunks={chunks}")
    body = b"".join(parts)
    own = entity.get(DUE_AT)
    due_at = due_of_row_key(str(entity["RowKey"])) if own is None else from_due_key(str(own))
    return DelayedMessage(
        message_id=str(entity["MessageId"]),
        destination=str(entity["Destination"]),
        body=body,
        due_at=due_at,
        headers=Headers(parse_headers_json(str(entity["Headers"]), max_chars=CHUNK_BYTES)),
        failure_count=int(entity.get("FailureCount", 0)),
    )


#: Largest salvaged body an unreadable row carries to the error queue (a queue message holds 64 KiB).
_SALVAGE_BYTES = 40 * 1024


def unreadable_message(entity: Mapping[str, Any], error: BaseException, now: datetime) -> DelayedMessage:
    """A well-formed stand-in for a due row that ``message_from_entity`` cannot read, bound for the error queue.

    It keeps the row's message id and due time where they are usable (else an id derived from the row's keys,
    and ``now``), the destination and the body bytes it can find (up to 40 KiB), and the reason, through
    ``model.unreadable_message``, so the dispatcher moves it to the error queue instead of sending it.
    """
    pk, rk = str(entity.get("PartitionKey", "")), str(entity.get("RowKey", ""))
    message_id = entity.get("MessageId")
    if not is_usable_message_id(message_id):
        message_id = f"unreadable-{id_hash(pk + '/' + rk)}"
    try:
        due_at = due_of_row_key(rk)
    except ValueError:
        due_at = utc(now)
    body = b"".join(v for k, v in sorted(entity.items()) if k.startswith("Body") and isinstance(v, bytes))
    reason = f"{type(error).__name__}: {error}"
    if len(body) > _SALVAGE_BYTES:
        reason += f" (body of {len(body)} bytes not kept)"
        body = b""
    return unreadable(str(message_id), entity.get("Destination"), body, due_at, f"row {pk}/{rk}: {reason}")
