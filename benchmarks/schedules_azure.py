"""Azure schedule timer: storage requests per occurrence, the timer's share (the dispatcher's: ``azure_dispatch``).

N schedules (``rate(1 minutes)``) on one endpoint on Azurite; the timer (lead 300 s, a manual clock) runs once to fill
the lead, then the clock moves one minute and it runs again: that steady pass writes one occurrence per schedule.
Every HTTP request of the steady pass is counted as it leaves the process (``azure_dispatch.counting_requests``), by
kind (``azure_dispatch``'s names): the occurrence rows are "other transaction" and each schedule's cursor write
(its row replaced, its due row moved: no merge in it) "delete transaction", one entity-group transaction each; the
due-row range queries "table query" (16 a pass); "other" the schedule rows' point reads (one a schedule: the
conditional write reuses the ETag read) and the 16 shard leases (acquire, release). An occurrence then costs what
the dispatcher spends on any table-routed message (about 1.045 requests: benchmarks/azure.md).

Run: ``python -m benchmarks.schedules_azure [--smoke] [--schedules 300] [--runs 3]``; writes
``benchmarks/results/schedules_azure[-smoke].json``. Figures: docs/schedules.md ("On Azure").
"""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime, timedelta

from benchmarks.azure_dispatch import _KINDS, _host, azurite, counting_requests
from benchmarks.common import Row, print_table, write_json
from delayed_delivery.azure.schedules.config import schedule_table_name
from delayed_delivery.azure.schedules.occurrence_rows import OccurrenceRows
from delayed_delivery.azure.schedules.store import TableScheduleStore
from delayed_delivery.azure.schedules.timer import AzureScheduleTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition

NAME = "schedules_azure"
LEAD_SECONDS = 300


def steady_pass(conn: str, schedules: int) -> dict[str, float]:
    """Requests of each kind per occurrence in a steady timer pass over ``schedules`` every-minute schedules."""
    host = _host(conn, 16)
    store = TableScheduleStore(host.clients.tables.get_table_client(schedule_table_name(host.config.table_name)))
    store.setup_infrastructure()
    try:
        start = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        template = MessageTemplate("bench", b'{"run": "every minute"}')
        for i in range(schedules):
            sid = f"b-{uuid.uuid4().hex[:8]}-{i}"
            store.create(Schedule.new(sid, ScheduleDefinition("rate(1 minutes)", start=start), template))
        clock = ManualClock(start - timedelta(seconds=30))
        rows = OccurrenceRows(host.store)  # as the function app's timer writes: each occurrence with its marker
        timer = AzureScheduleTimer(store, rows, host.container, clock=clock, lead_seconds=LEAD_SECONDS)
        timer.run()  # fills the lead
        clock.advance(60)
        with counting_requests() as counts:
            run = timer.run()
        assert run.fired == schedules and run.failures == 0, run.summary()
        per = {kind: counts[kind] / run.fired for kind in _KINDS}
        per["all"] = sum(counts.values()) / run.fired
        return per
    finally:
        store.drop()
        host.store.drop()


def run(smoke: bool = False, *, schedules: int = 300, runs: int = 3) -> list[Row]:
    """Measure ``runs`` steady passes and return the rows."""
    if smoke:
        schedules, runs = 30, 1
    with azurite() as conn:
        outcomes = [steady_pass(conn, schedules) for _ in range(runs)]
    note = f"{schedules} schedules, rate(1 minutes), lead {LEAD_SECONDS} s, steady pass (one occurrence each)"
    return [
        Row(NAME, f"timer requests per occurrence: {kind}", "requests", tuple(o[kind] for o in outcomes), notes=note)
        for kind in (*_KINDS, "all")
        if any(o[kind] for o in outcomes) or kind == "all"
    ]


def main() -> None:
    """Command line: print the table and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--schedules", type=int, default=300)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    rows = run(a.smoke, schedules=a.schedules, runs=a.runs)
    print_table(rows, NAME)
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows))


if __name__ == "__main__":
    main()
