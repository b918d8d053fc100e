"""Recurring schedules' wire formats: the SQLite schedules row (with its definition document) and an occurrence's
message (id, due time, headers). Today's writers write the newest golden file of each; every version is read back.

The fixed inputs below are part of the goldens: never edit them (add new ones beside them for a new version).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery import headers as hdr
from delayed_delivery.schedules.catchup import CatchUp, CatchUpPolicy
from delayed_delivery.schedules.materializer import occurrence_message
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition, ScheduleState
from delayed_delivery.schedules.occurrences import expand
from delayed_delivery.schedules.sqlite_store import SqliteScheduleStore
from tests.golden import wire
from tests.golden.test_writers import _check

SCHEDULE_ID = "golden-sched-1"
DEFINITION = ScheduleDefinition(
    expression="30 2 * * MON-FRI",
    start=datetime(2031, 3, 1, tzinfo=UTC),
    zone="America/New_York",
    dst="clamp/both",
    day_match="or",  # type: ignore[arg-type]
    end=datetime(2032, 1, 1, tzinfo=UTC),
    jitter_seconds=90,
    catch_up=CatchUp(CatchUpPolicy.LATEST, 3600, 12),
)
TEMPLATE = MessageTemplate("reports", "daily report ☕ \x00\x01".encode(), {"kind": "report", "note": "café"})
CURSOR = datetime(2031, 3, 10, 6, 30, tzinfo=UTC)
#: 2031-03-10 is the Monday after the gap (2031-03-09): its 02:30 exists.
NEXT_AT = datetime(2031, 3, 11, 6, 30, tzinfo=UTC)


def _schedule() -> Schedule:
    s = Schedule.new(SCHEDULE_ID, DEFINITION, TEMPLATE)
    return s.next_version(
        state=ScheduleState.PAUSED, cursor=CURSOR, next_at=NEXT_AT, fired=7, missed=2, skipped_paused=1,
        paused_at=CURSOR + timedelta(hours=1), last_fired=CURSOR,
    )  # fmt: skip


def _sqlite_schedule_row(folder: Path) -> dict[str, Any]:
    path = folder / "golden.db"
    store = SqliteScheduleStore(path)
    store.setup_infrastructure()
    store.create(_schedule())
    with sqlite3.connect(path) as conn:
        schema = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")]
        cursor = conn.execute("SELECT * FROM delayed_schedules")
        columns = [d[0] for d in cursor.description]
        [row] = cursor.fetchall()
    conn.close()
    return {"table": "delayed_schedules", "schema": schema, "row": dict(zip(columns, row, strict=True))}


def _occurrence_message() -> dict[str, Any]:
    """The message of the occurrence after the cursor: id, destination, body, due time (with jitter), headers."""
    occurrence = next(
        expand(DEFINITION.recurrence(), NEXT_AT, schedule_id=SCHEDULE_ID, max_jitter=DEFINITION.jitter_seconds)
    )
    m = occurrence_message(_schedule(), occurrence)
    return {
        "message_id": m.message_id,
        "destination": m.destination,
        "body": m.body,
        "due_at": m.due_at.isoformat(),
        "headers": dict(m.headers),
    }


def test_the_sqlite_schedules_row_is_the_golden_one(tmp_path: Path) -> None:
    _check("sqlite_schedule_row", _sqlite_schedule_row(tmp_path))


def test_an_occurrence_message_is_the_golden_one() -> None:
    _check("occurrence_message", _occurrence_message())


@pytest.mark.parametrize("golden", wire.versions("sqlite_schedule_row"))
def test_the_sqlite_schedule_store_reads_a_golden_row(tmp_path: Path, golden: str) -> None:
    document = wire.load(golden)
    path = tmp_path / "old.db"
    row = document["row"]
    with sqlite3.connect(path) as conn:
        for statement in document["schema"]:
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO {document['table']} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            list(row.values()),
        )
    conn.close()
    store = SqliteScheduleStore(path, table=document["table"])
    store.setup_infrastructure()
    assert store.get(SCHEDULE_ID) == _schedule()
    assert json.loads(row["definition"])["v"] == 1


@pytest.mark.parametrize("golden", wire.versions("occurrence_message"))
def test_an_occurrence_message_reads_back_its_schedule_and_nominal_instant(golden: str) -> None:
    document = wire.load(golden)
    sid, _, nominal = document["message_id"].rpartition("@")
    assert sid == document["headers"][hdr.SCHEDULE_ID] == SCHEDULE_ID
    assert nominal == document["headers"][hdr.OCCURRENCE]
    assert document["headers"]["kind"] == "report"
    due = datetime.fromisoformat(document["due_at"])
    assert datetime.fromisoformat(nominal) <= due <= datetime.fromisoformat(nominal) + timedelta(seconds=90)


def test_the_schedule_goldens_exist() -> None:
    for kind in ("sqlite_schedule_row", "occurrence_message"):
        assert wire.versions(kind), f"no golden file for {kind}: its reader test would not run"
