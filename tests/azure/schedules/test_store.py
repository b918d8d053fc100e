"""What the Azure schedule store adds to the contract: bounded rows, unreadable rows passed over, keys and shards."""

from __future__ import annotations

from datetime import timedelta

import pytest

from delayed_delivery.azure.schedules import rows
from delayed_delivery.azure.schedules.store import TableScheduleStore
from delayed_delivery.errors import InvalidScheduleError
from delayed_delivery.schedules.model import ScheduleState
from delayed_delivery.testing.schedule_store_contract import T0, hourly

pytestmark = pytest.mark.azurite


def test_a_schedule_and_its_due_row_share_a_partition_and_move_together(schedule_table: TableScheduleStore) -> None:
    s = hourly("keys-1")
    schedule_table.create(s)
    pk = rows.partition_of("keys-1")
    keys = sorted(e["RowKey"] for e in schedule_table.table.query_entities("PartitionKey eq @pk",
                                                                          parameters={"pk": pk}))  # fmt: skip
    assert keys == ["n_20300101000000000000_keys-1", "r_keys-1"]
    assert schedule_table.replace(s.next_version(state=ScheduleState.PAUSED), s.version)
    keys = [e["RowKey"] for e in schedule_table.table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})]
    assert keys == ["r_keys-1"], "a paused schedule has no due row"
    assert schedule_table.delete("keys-1") is True
    assert list(schedule_table.table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})) == []


@pytest.mark.parametrize(
    "garbage",
    [
        {"Format": 2},
        {"Definition": "{" * 50},
        {"BodyChunks": 9},
        {"Fired": -1},
        {"State": "sleeping"},
        {"Cursor": "yesterday"},
        {"Destination": 7},
        {"Headers": "[1]"},
    ],
)
def test_an_unreadable_row_is_one_line_for_get_and_passed_over_by_a_pass(
    schedule_table: TableScheduleStore, garbage: dict[str, object]
) -> None:
    bad, good = hourly("bad-1"), hourly("good-1")
    for s in (bad, good):
        schedule_table.create(s)
    schedule_table.table.upsert_entity({**rows.schedule_entity(bad), **garbage})
    with pytest.raises(InvalidScheduleError, match="unreadable schedule row 'r_bad-1'") as caught:
        schedule_table.get("bad-1")
    assert "\n" not in str(caught.value)
    assert [s.schedule_id for s in schedule_table.due(T0 + timedelta(hours=1), 10)] == ["good-1"]
    assert [s.schedule_id for s in schedule_table.list()] == ["good-1"]


def test_a_shard_view_sees_only_its_shard(schedule_table: TableScheduleStore) -> None:
    ids = [f"v-{i}" for i in range(12)]
    for sid in ids:
        schedule_table.create(hourly(sid))
    seen: list[str] = []
    for shard in range(rows.SHARDS):
        due = schedule_table.for_shards([shard]).due(T0, 100)
        assert all(rows.shard_of(s.schedule_id) == shard for s in due)
        seen.extend(s.schedule_id for s in due)
    assert sorted(seen) == sorted(ids)
    assert len({rows.shard_of(sid) for sid in ids}) > 1
