"""The Azure schedules table's wire format: a schedule's row and its due row (format 1). Today's writer writes the
newest golden file; every version is written to Azurite as stored and read back by the store. The fixed inputs are
part of the goldens: never edit them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from azure.data.tables import EdmType, EntityProperty

from delayed_delivery.azure.schedules.rows import due_entity, schedule_entity
from delayed_delivery.schedules.catchup import CatchUp, CatchUpPolicy
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from tests.golden import wire
from tests.golden.test_writers import _check

SCHEDULE_ID = "golden-azure-1"
DEFINITION = ScheduleDefinition(
    expression="15 6 L * *",
    start=datetime(2031, 3, 1, tzinfo=UTC),
    zone="Australia/Lord_Howe",
    dst="shift/both",
    end=datetime(2033, 1, 1, tzinfo=UTC),
    jitter_seconds=30,
    catch_up=CatchUp(CatchUpPolicy.LATEST, 7200, 5),
)
#: A body of two chunks (64 KiB and the rest).
TEMPLATE = MessageTemplate("reports", "month end ☕ ".encode() * 6000, {"kind": "report", "note": "café"})
CURSOR = datetime(2031, 3, 30, 19, 15, tzinfo=UTC)
NEXT_AT = datetime(2031, 4, 29, 20, 15, tzinfo=UTC)


def _schedule() -> Schedule:
    s = Schedule.new(SCHEDULE_ID, DEFINITION, TEMPLATE)
    return s.next_version(cursor=CURSOR, next_at=NEXT_AT, fired=3_000_000_000, missed=2, last_fired=CURSOR)


def _plain(entity: dict[str, Any] | None) -> dict[str, Any] | None:
    """An entity as JSON: Int64 properties as ``{"Edm.Int64": value}``."""
    if entity is None:
        return None
    return {k: {"Edm.Int64": v.value} if isinstance(v, EntityProperty) else v for k, v in entity.items()}


def _typed(entity: dict[str, Any]) -> dict[str, Any]:
    return {k: EntityProperty(v["Edm.Int64"], EdmType.INT64) if isinstance(v, dict) else v for k, v in entity.items()}


def _rows() -> dict[str, Any]:
    s = _schedule()
    return {"schedule": _plain(schedule_entity(s)), "due": _plain(due_entity(s))}


def test_the_azure_schedule_rows_are_the_golden_ones() -> None:
    _check("azure_schedule_rows", _rows())


@pytest.mark.azurite
@pytest.mark.parametrize("golden", wire.versions("azure_schedule_rows"))
def test_the_azure_schedule_store_reads_golden_rows(golden: str, azurite_conn: str) -> None:
    from tests.azure.conftest import new_name
    from tests.azure.schedules.conftest import make_schedule_store

    document = wire.load(golden)
    store = make_schedule_store(azurite_conn, new_name("gold"))
    try:
        store.table.create_entity(_typed(document["schedule"]))
        store.table.create_entity(_typed(document["due"]))
        assert store.get(SCHEDULE_ID) == _schedule()
        [due] = store.due(NEXT_AT, 10)
        assert due == _schedule()
        assert store.list() == [_schedule()]
    finally:
        store.drop()


def test_the_azure_schedule_goldens_exist() -> None:
    assert wire.versions("azure_schedule_rows"), "no golden file: its reader test would not run"
