"""The Azure schedules burst benchmark at smoke size (Azurite), and its model's arithmetic."""

from __future__ import annotations

import pytest

from benchmarks import schedules_azure_burst as bench
from delayed_delivery.azure.schedules import rows as schedule_rows


def test_the_model_writes_a_burst_within_the_lead_when_the_timer_is_fast_and_late_when_it_is_slow() -> None:
    short_lead = bench.SETUPS[0]
    fast = bench.model(short_lead, 2_000, 0.001, 0.00364, 0.010, 3.2)
    assert fast["written_last_s"] == 0 and fast["visible_last_s"] == 0  # all placed ahead, visible at 09:00
    slow = bench.model(short_lead, 100_000, 0.005, 0.00364, 0.010, 3.2)
    # 4 shards side by side, 3.2 sequential requests of 10 ms + 5 ms CPU: 108 a second, 50 s of each minute
    assert 600 < slow["written_last_s"] < 900 and slow["visible_p99_s"] > slow["visible_p50_s"] > 0
    longer = bench.model(bench.SETUPS[1], 100_000, 0.005, 0.00364, 0.010, 3.2)
    assert longer["visible_p99_s"] < slow["visible_p99_s"]  # a longer lead leaves the timer more time before 09:00


@pytest.mark.azurite
def test_the_azurite_burst_delivers_each_occurrence_once_at_smoke_size(
    azurite_conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURITE_CONNECTION_STRING", azurite_conn)
    rows = bench.run(smoke=True)
    local = bench.run.last["azurite"]  # type: ignore[attr-defined]
    assert rows and all(r.samples for r in rows)
    assert (local["lost"], local["duplicates"], local["early"], local["row_writes_repeated"]) == (0, 0, 0, 0)
    assert local["rows_written"] == local["schedules"] == 20
    per = local["requests_per_occurrence"]
    # rows and markers, and cursors, one transaction per schedule shard's pass (the 20 spread over at most 16 shards;
    # before: one each)
    shards = len({schedule_rows.shard_of(f"b{i:07d}") for i in range(20)})
    assert per["timer: other transaction"] == per["timer: delete transaction"] == shards / 20 < 1.0
    assert per["dispatcher: put message"] == 1.0
    assert local["timer_cpu_ms_per_occurrence"] > 0 and local["usd_per_million"] > 0
