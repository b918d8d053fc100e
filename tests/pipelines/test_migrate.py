"""The migrate job on a real local SparkSession, into the embedded SQLite store."""

from __future__ import annotations

import base64
import csv
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.pipelines.ledger import BatchState, Ledger, RunManifest
from delayed_delivery.pipelines.migrate import (
    MigrationOptions,
    abort_migration,
    preview_migration,
    run_migration,
)
from delayed_delivery.pipelines.schema import SAGA_ID_HEADER, LegacyShape
from delayed_delivery.pipelines.synthetic import DEFAULT_NOW, write_legacy_export
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore

pytestmark = pytest.mark.spark

NOW = DEFAULT_NOW


def ids_in(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT message_id FROM delayed_messages")}


def write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def tm(i: int, due: datetime, **kw: object) -> dict[str, object]:
    row: dict[str, object] = {
        "Id": f"id-{i}",
        "Destination": "orders" if i % 2 else "invoices",
        "SagaId": f"saga-{i}" if i == 1 else "",
        "State": base64.b64encode(f"body-{i}".encode()).decode(),
        "Time": due.strftime("%Y-%m-%d %H:%M:%S"),
        "Headers": json.dumps({"h": str(i), "quoted": 'say "hi", twice'}),
        "Endpoint": "Sales" if i < 4 else "Billing",
    }
    row.update(kw)
    return row


@pytest.fixture
def small_export(tmp_path: Path) -> Path:
    rows = [tm(i, NOW + timedelta(days=i)) for i in range(1, 7)]
    rows.append(tm(7, NOW - timedelta(minutes=5)))  # already due
    rows.append(tm(8, NOW, Destination=""))
    rows.append(tm(9, NOW, Time="31/02/2026"))
    rows.append(tm(10, NOW, Headers="{not json"))
    return write_csv(tmp_path / "src" / "timeouts.csv", rows)


def test_csv_export_maps_into_sqlite_and_rejects_go_to_the_rejects_output(
    spark: Any, small_export: Path, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    options = MigrationOptions(source=str(small_export), target=f"sqlite:{db}", batches=3)
    summary = run_migration(spark, options, str(tmp_path / "out"), now=NOW)

    assert (summary.to_migrate, summary.rejected, summary.rows_written, summary.already_due) == (7, 3, 7, 1)
    assert summary.state == "completed"
    store = SqliteDelayedMessageStore(db)
    one = store.get("id-1")
    assert one is not None
    assert (one.destination, one.body, one.due_at) == ("orders", b"body-1", NOW + timedelta(days=1))
    assert one.headers["quoted"] == 'say "hi", twice'
    assert one.headers[SAGA_ID_HEADER] == "saga-1"
    # Already due: stored with its past due time, so the dispatcher's next fetch delivers it at once.
    assert [m.message_id for m in store.fetch_due(NOW, 10)] == ["id-7"]

    rejects = [json.loads(line) for p in Path(summary.rejects_path or "").glob("*.json") for line in p.open()]
    by_id = {json.loads(r["raw"])["Id"]: r["reason"] for r in rejects}
    assert by_id == {
        "id-8": "missing destination",
        "id-9": "unparsable time '31/02/2026'",
        "id-10": "unparsable headers (not a JSON object)",
    }


def test_json_lines_and_parquet_exports_of_the_delayed_store_shape(spark: Any, tmp_path: Path) -> None:
    rows = [
        {"Id": "j-1", "Destination": "q", "State": base64.b64encode(b"x").decode(), "Time": "2026-02-01T00:00:00Z",
         "Headers": {"a": "b"}, "RetryCount": 1},
        {"Id": "j-2", "Destination": "q", "State": "", "Time": "2026-02-02T00:00:00Z", "Headers": None,
         "RetryCount": 0},
    ]  # fmt: skip
    src = tmp_path / "jsonl"
    src.mkdir()
    (src / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json at all\n")
    db = tmp_path / "j.db"
    opts = MigrationOptions(source=str(src), target=f"sqlite:{db}", source_endpoint="Legacy", batches=2)
    summary = run_migration(spark, opts, str(tmp_path / "out"), now=NOW)
    assert (summary.rows_written, summary.rejected) == (2, 1)
    msg = SqliteDelayedMessageStore(db).get("j-1")
    assert msg is not None and msg.failure_count == 1 and msg.headers["a"] == "b"

    from pyspark.sql import Row

    parquet = str(tmp_path / "pq")
    spark.createDataFrame(
        [Row(Id="p-1", Destination="q", State=bytearray(b"\x00\x01"), Time=datetime(2026, 5, 1, 8, 30),
             Headers="{}", RetryCount=0)]
    ).write.parquet(parquet)  # fmt: skip
    db2 = tmp_path / "p.db"
    run_migration(spark, MigrationOptions(source=parquet, target=f"sqlite:{db2}", batches=1), str(tmp_path / "o2"))
    got = SqliteDelayedMessageStore(db2).get("p-1")
    assert got is not None and got.body == b"\x00\x01"
    assert got.due_at == datetime(2026, 5, 1, 8, 30, tzinfo=UTC)


def test_rerun_with_the_same_arguments_skips_completed_batches_and_never_duplicates(spark: Any, tmp_path: Path) -> None:
    export = write_legacy_export(tmp_path / "src", LegacyShape.TIMEOUT_MANAGER, 400, malformed_every=50)
    db = tmp_path / "s.db"
    opts = MigrationOptions(source=export.path, target=f"sqlite:{db}", batches=4)
    out = str(tmp_path / "out")

    first = run_migration(spark, opts, out, max_batches=1, now=NOW)
    assert (first.batches_written, first.state) == (1, "running")
    done_first = ids_in(db)
    assert 0 < len(done_first) < 392
    # Simulate a run killed inside batch b: its ledger says "started" and half its rows are written.
    ledger = Ledger(RunManifest.folder(out, first.run_id))
    (completed,) = ledger.in_state(BatchState.COMPLETED)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM delayed_messages")  # anything re-sent for a completed batch would reappear
    ledger.mark((completed + 1) % 4, BatchState.STARTED)

    second = run_migration(spark, opts, out, now=NOW)
    assert (second.batches_skipped, second.batches_written, second.state) == (1, 3, "completed")
    assert ids_in(db).isdisjoint(done_first)
    assert len(ids_in(db)) + len(done_first) == 392 == second.to_migrate

    # A new run id with the same arguments rewrites everything: same ids, so overwritten, not duplicated.
    again = run_migration(spark, opts, out, run_id="again", now=NOW)
    assert again.rows_written == 392
    assert len(ids_in(db)) == 392


def test_different_arguments_against_the_same_run_id_are_refused(spark: Any, tmp_path: Path) -> None:
    export = write_legacy_export(tmp_path / "src", LegacyShape.TIMEOUT_MANAGER, 20)
    db, out = tmp_path / "s.db", str(tmp_path / "out")
    run_migration(spark, MigrationOptions(source=export.path, target=f"sqlite:{db}", batches=2), out, run_id="r")
    changed = MigrationOptions(source=export.path, target=f"sqlite:{db}", batches=2, cutoff=NOW)
    with pytest.raises(ConfigurationError, match=r"run 'r' was started with different arguments \(cutoff"):
        run_migration(spark, changed, out, run_id="r")


def test_cutoff_endpoint_filter_and_dry_run(spark: Any, small_export: Path, tmp_path: Path) -> None:
    db, out = tmp_path / "s.db", tmp_path / "out"
    opts = MigrationOptions(
        source=str(small_export), target=f"sqlite:{db}", cutoff=NOW + timedelta(days=2), endpoints=("Sales",)
    )
    dry = run_migration(spark, opts, str(out), dry_run=True, now=NOW)
    assert (dry.dry_run, dry.to_migrate, dry.rows_written) == (True, 1, 0)  # only id-3: Sales, due after day 2
    assert not db.exists() and not out.exists()
    run_migration(spark, opts, str(out), now=NOW)
    assert ids_in(db) == {"id-3"}


def test_abort_removes_what_the_run_wrote_and_reports_what_was_already_delivered(
    spark: Any, small_export: Path, tmp_path: Path
) -> None:
    db, out = tmp_path / "s.db", str(tmp_path / "out")
    opts = MigrationOptions(source=str(small_export), target=f"sqlite:{db}", batches=2)
    summary = run_migration(spark, opts, out, now=NOW)
    store = SqliteDelayedMessageStore(db)
    store.store(_unrelated())  # written by someone else: abort must leave it alone
    assert store.remove("id-7")  # delivered by a dispatcher before the abort

    result = abort_migration(spark, out, summary.run_id)
    assert (result.undone, result.removed, result.already_gone) == (True, 6, 1)
    assert ids_in(db) == {"unrelated"}
    assert RunManifest.load(out, summary.run_id).state.value == "aborted"  # type: ignore[union-attr]
    with pytest.raises(ConfigurationError, match="was aborted"):
        run_migration(spark, opts, out, run_id=summary.run_id)
    with pytest.raises(ConfigurationError, match="no run 'nope'"):
        abort_migration(spark, out, "nope")


def _unrelated() -> Any:
    from delayed_delivery.model import DelayedMessage

    return DelayedMessage.create("other", b"", at=NOW, message_id="unrelated")


def test_preview_counts_extremes_warning_and_histogram(spark: Any, small_export: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = MigrationOptions(source=str(small_export))
    p = preview_migration(spark, opts, str(out), now=NOW)
    assert (p.total_rows, p.to_migrate, p.rejected, p.already_due, p.due_soon) == (10, 7, 3, 1, 0)
    assert p.earliest_due == NOW - timedelta(minutes=5)
    assert p.latest_due == NOW + timedelta(days=6)
    counts = {(d.endpoint, d.destination): d.count for d in p.by_destination}
    assert counts == {("Sales", "orders"): 2, ("Sales", "invoices"): 1, ("Billing", "invoices"): 2,
                      ("Billing", "orders"): 2}  # fmt: skip
    assert p.warning is not None and "already due" in p.warning
    assert p.bucket == "day" and sum(c for _, c in p.histogram) == 7
    assert p.chart is not None and Path(p.chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    later = preview_migration(spark, opts, None, now=NOW - timedelta(days=1))
    assert later.warning is None and later.chart is None
    soon = preview_migration(spark, opts, None, now=NOW + timedelta(days=1) - timedelta(hours=3))
    assert (
        soon.due_soon == 1
        and soon.warning is not None
        and "1 timeout(s) are due within the next 4 hours" in soon.warning
    )
