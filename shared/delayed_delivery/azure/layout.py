"""The delays table's shard count, recorded in the table itself, and the check every process makes at start-up.

A message's partition is its id's hash modulo the shard count, so every sender, the timer and every operator of a
table must use the same count. ``azure setup`` (``AzureDispatcherHost.setup_infrastructure``) records it in the
table, in the entity ``PartitionKey = "layout"``, ``RowKey = "shards"``: ``Shards`` (Int32), ``Version`` (1),
``RecordedAt`` (ISO-8601 UTC), and while ``azure reshard`` moves the rows, ``ReshardTo`` (Int32). No query of the
due or index rows reads it (they are all ranges of ``d_`` or ``i_`` keys inside ``sNNN`` partitions).

``resolve_shards`` is what a process calls before it touches rows: it returns the table's count. A process whose
count was set on purpose (``DELAYED_DELIVERY_SHARDS``) and differs is refused with one line (``ConfigurationError``),
and so is every process while a reshard runs. A table made by an earlier version has no record: the first process
records its count (its setting, else 1), after checking that the rows already there were written with that count
(rows in partitions past it, or a sample of due rows whose ids hash elsewhere, are refused, naming the count they
were written with when a sample shows it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core.exceptions import AzureError, HttpResponseError, ResourceExistsError, ResourceNotFoundError

from .. import logfields as lf
from ..errors import ConfigurationError
from ..validation import is_whole
from . import rows
from .sdk_errors import translate

__all__ = [
    "LAYOUT_PARTITION",
    "LAYOUT_ROW",
    "Layout",
    "misplaced_partitions",
    "partitions_in_use",
    "read_layout",
    "record_layout",
    "resolve_shards",
    "table_layout",
    "written_with",
]

LAYOUT_PARTITION = "layout"
LAYOUT_ROW = "shards"
_VERSION = 1
#: Due rows sampled to check that an unrecorded table's rows agree with a shard count.
SAMPLE = 200
_RESHARD_HINT = "to change it, use `delayed-delivery azure reshard` (docs/azure.md, 'Changing the shard count')"
_log = logging.getLogger("delayed_delivery.azure.layout")


@dataclass(frozen=True, slots=True)
class Layout:
    """What the table records: its shard count and, while ``azure reshard`` runs, the count it moves to."""

    shards: int
    resharding_to: int | None = None
    etag: str = ""
    #: False when the count could not be recorded (no table yet, or an identity that may not write the entity).
    recorded: bool = True


def layout_entity(shards: int, now: datetime, resharding_to: int | None = None) -> dict[str, Any]:
    """The layout entity (format version 1)."""
    entity: dict[str, Any] = {
        "PartitionKey": LAYOUT_PARTITION,
        "RowKey": LAYOUT_ROW,
        "Shards": shards,
        "Version": _VERSION,
        "RecordedAt": now.astimezone(UTC).isoformat(),
    }
    if resharding_to is not None:
        entity["ReshardTo"] = resharding_to
    return entity


def layout_of(entity: Mapping[str, Any], table: str) -> Layout:
    """The layout an entity records; ``ConfigurationError`` when it is not a usable one."""
    shards, target = entity.get("Shards"), entity.get("ReshardTo")
    if not is_whole(shards, 1, rows.MAX_SHARDS) or (target is not None and not is_whole(target, 1, rows.MAX_SHARDS)):
        raise ConfigurationError(
            f"the delays table {table!r} records an unusable shard count ({shards!r}): write a whole number from 1 "
            f"to {rows.MAX_SHARDS} into its entity {LAYOUT_PARTITION}/{LAYOUT_ROW} (property Shards)"
        )
    etag = getattr(entity, "metadata", {}).get("etag", "")
    return Layout(int(shards), None if target is None else int(target), str(etag or ""))


def read_layout(table: Any) -> Layout | None:
    """The table's recorded layout, or None (an earlier version's table, or no table)."""
    try:
        entity = table.get_entity(LAYOUT_PARTITION, LAYOUT_ROW)
    except ResourceNotFoundError:
        return None
    except AzureError as exc:
        raise translate(exc, f"reading the shard count of table {table.table_name}") from exc
    return layout_of(entity, table.table_name)


def record_layout(table: Any, shards: int) -> Layout:
    """Record ``shards`` in a table that records none (after checking its rows agree); the layout that holds now.

    Without the table (not created yet) nothing is recorded and ``shards`` holds.
    """
    _check_rows_agree(table, shards)
    try:
        table.create_entity(layout_entity(shards, datetime.now(UTC)))
    except ResourceExistsError:
        recorded = read_layout(table)  # another process recorded it meanwhile
        if recorded is not None:
            return recorded
    except ResourceNotFoundError:
        return Layout(shards, recorded=False)  # no table yet: whoever creates it records the count
    except HttpResponseError as exc:
        if exc.status_code != 403:
            raise translate(exc, f"recording the shard count of table {table.table_name}") from exc
        _log.warning(  # an identity that may read rows but not write this one: use the count, unrecorded
            "cannot record the shard count in the delays table",
            extra={lf.REASON: f"403 writing {LAYOUT_PARTITION}/{LAYOUT_ROW} of {table.table_name}"},
        )
        return Layout(shards, recorded=False)
    except AzureError as exc:
        raise translate(exc, f"recording the shard count of table {table.table_name}") from exc
    return Layout(shards)


def resolve_shards(table: Any, shards: int, *, configured: bool, setting: str = "DELAYED_DELIVERY_SHARDS") -> int:
    """The table's shard count, recorded now if the table has none; ``ConfigurationError`` (one line) when this
    process's count was set on purpose (``configured``) and differs, or while a reshard runs."""
    return table_layout(table, shards, configured=configured, setting=setting).shards


def table_layout(table: Any, shards: int, *, configured: bool, setting: str = "DELAYED_DELIVERY_SHARDS") -> Layout:
    """``resolve_shards``, with the whole layout (``recorded`` False: no table yet, nothing recorded)."""
    layout = read_layout(table)
    if layout is None:
        layout = record_layout(table, shards)
    name = table.table_name
    if layout.resharding_to is not None:
        raise ConfigurationError(
            f"the delays table {name!r} is being resharded from {layout.shards} to {layout.resharding_to} shard(s): "
            "start again once `delayed-delivery azure reshard` has finished (or run it again to finish it)"
        )
    if configured and shards != layout.shards:
        raise ConfigurationError(
            f"the delays table {name!r} records {layout.shards} shard(s), but {setting} is {shards} here: unset it "
            f"(the table's count is used) or set it to {layout.shards}; {_RESHARD_HINT}"
        )
    return layout


def partitions_in_use(table: Any, start: int = 0) -> list[str]:
    """The shard partitions from ``start`` on that hold rows: one query per partition found, plus one."""
    found: list[str] = []
    lo = rows.partition_key(start) if start < rows.MAX_SHARDS else None
    try:
        while lo is not None:
            first = next(
                iter(
                    table.query_entities(
                        "PartitionKey ge @lo and PartitionKey lt @hi",
                        parameters={"lo": lo, "hi": "t"},
                        select=["PartitionKey"],
                        results_per_page=1,
                    )
                ),
                None,
            )
            if first is None:
                break
            found.append(str(first["PartitionKey"]))
            lo = found[-1] + "\x00"  # the next partition key after this one
    except ResourceNotFoundError:
        return []
    except AzureError as exc:
        raise translate(exc, f"reading table {table.table_name}") from exc
    return found


def misplaced_partitions(table: Any, shards: int) -> list[str]:
    """Partitions at or past ``shards`` that hold rows: rows no dispatcher of a ``shards``-shard table reads."""
    return partitions_in_use(table, shards)


def written_with(table: Any, shards: int) -> tuple[bool, int | None]:
    """Whether a sample of due rows sits where ``shards`` puts their ids; if not, the smallest count that fits them
    all (None when none does)."""
    sample: list[tuple[str, str]] = []
    try:
        for entity in table.query_entities(
            "RowKey ge @lo and RowKey lt @hi",
            parameters={"lo": rows.DUE_PREFIX, "hi": rows.DUE_END},
            select=["PartitionKey", "MessageId"],
            results_per_page=SAMPLE,
        ):
            if isinstance(entity.get("MessageId"), str):
                sample.append((str(entity["PartitionKey"]), str(entity["MessageId"])))
            if len(sample) >= SAMPLE:
                break
    except ResourceNotFoundError:
        return True, None
    except AzureError as exc:
        raise translate(exc, f"reading table {table.table_name}") from exc

    def fits(n: int) -> bool:
        return all(rows.partition_key(rows.shard_of(mid, n)) == pk for pk, mid in sample)

    if fits(shards):
        return True, None
    return False, next((n for n in range(1, rows.MAX_SHARDS + 1) if fits(n)), None)


def _check_rows_agree(table: Any, shards: int) -> None:
    """Refuse to record ``shards`` for a table whose rows were written with another count."""
    name = table.table_name
    past = misplaced_partitions(table, shards)
    agree, other = written_with(table, shards)
    if not past and agree:
        return
    if other is not None:
        written = f"its rows were written with {other} shard(s)"
        fix = f"set DELAYED_DELIVERY_SHARDS={other} and start again (that count is then recorded)"
    else:
        written = f"rows in partitions {', '.join(past[:3])}" if past else "its rows hash to other partitions"
        fix = "set DELAYED_DELIVERY_SHARDS to the count its senders used"
    raise ConfigurationError(
        f"the delays table {name!r} records no shard count and {written}, not with {shards}: {fix}"
    )
