"""The generated legacy SQL hides exactly the migrated rows in PostgreSQL, runs twice safely, and restores them."""

from __future__ import annotations

import csv
import sqlite3
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.pipelines.legacy_sql import Dialect, LegacyTable, hide_script, restore_script
from delayed_delivery.pipelines.migrate import MigrationOptions, abort_migration, run_migration
from delayed_delivery.pipelines.schema import LegacyShape
from delayed_delivery.pipelines.synthetic import DEFAULT_NOW, write_legacy_export

pytestmark = pytest.mark.postgres


def _ids(conn: Any, table: str) -> set[str]:
    return {str(r[0]) for r in conn.execute(f'SELECT "Id" FROM "{table}"')}


def test_hide_moves_exactly_the_given_ids_is_idempotent_and_restore_gives_them_back(postgres_conninfo: str) -> None:
    import psycopg

    table = "TimeoutData_" + uuid.uuid4().hex[:8]
    all_ids = [uuid.uuid4() for _ in range(12)]
    hidden = all_ids[:5]
    # An export of SQL Server prints GUIDs in upper case; one migrated id is not in this table at all.
    given = [str(u).upper() for u in hidden] + [str(uuid.uuid4())]
    legacy = LegacyTable(table)
    run_id = "run-Ab.c"
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{table}" ("Id" uuid PRIMARY KEY, "Destination" text, "State" bytea, '
            '"Time" timestamp, "Headers" text, "OwningTimeoutManager" text)'
        )
        for u in all_ids:
            conn.execute(
                f'INSERT INTO "{table}" VALUES (%s, %s, %s, now(), %s, %s)', (u, "orders", b"x", "{}", "Sales")
            )
        script = "".join(hide_script(Dialect.POSTGRESQL, legacy, run_id, given))
        conn.execute(script)  # type: ignore[arg-type]
        moved = f"{table}_migration_run_ab_c"
        assert _ids(conn, table) == {str(u) for u in all_ids[5:]}
        assert _ids(conn, moved) == {str(u) for u in hidden}
        conn.execute(script)  # type: ignore[arg-type]  # a second run changes nothing
        assert len(_ids(conn, table)) == 7 and len(_ids(conn, moved)) == 5
        conn.execute(restore_script(Dialect.POSTGRESQL, legacy, run_id))  # type: ignore[arg-type]
        assert _ids(conn, table) == {str(u) for u in all_ids}
        assert conn.execute("SELECT to_regclass(%s)", (f'"{moved}"',)).fetchone() == (None,)


@pytest.mark.spark
def test_run_writes_migrated_ids_and_a_hide_script_that_leaves_only_unmigrated_rows(
    spark: Any, postgres_conninfo: str, tmp_path: Path
) -> None:
    import psycopg

    export = write_legacy_export(tmp_path / "src", LegacyShape.TIMEOUT_MANAGER, 300, malformed_every=40, seed=3)
    cutoff = DEFAULT_NOW + timedelta(days=30)
    db, out = tmp_path / "s.db", tmp_path / "out"
    table = "TimeoutData_" + uuid.uuid4().hex[:8]
    opts = MigrationOptions(source=export.path, target=f"sqlite:{db}", batches=3, cutoff=cutoff)
    summary = run_migration(spark, opts, str(out), now=DEFAULT_NOW, legacy_table=LegacyTable(table))
    with sqlite3.connect(db) as lite:
        migrated = {r[0] for r in lite.execute("SELECT message_id FROM delayed_messages")}
    assert summary.migrated_ids_path and summary.legacy_scripts
    assert {r["message_id"] for r in spark.read.parquet(summary.migrated_ids_path).collect()} == migrated
    assert 0 < len(migrated) == summary.rows_written < 300  # rejects and rows before the cutoff stay behind

    rows = [r for p in sorted(Path(export.path).glob("*.csv")) for r in csv.DictReader(p.open(newline=""))]
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:  # the legacy table, every exported row
        cols = list(rows[0])
        conn.execute(f'CREATE TABLE "{table}" ({", ".join(f"{chr(34)}{c}{chr(34)} text" for c in cols)})')
        with conn.cursor() as cur:
            cur.executemany(
                f'INSERT INTO "{table}" VALUES ({", ".join(["%s"] * len(cols))})', [list(r.values()) for r in rows]
            )
        conn.execute(Path(summary.legacy_scripts, "hide.postgresql.sql").read_text())  # type: ignore[arg-type]
        left = [str(r[0]) for r in conn.execute(f'SELECT "Id" FROM "{table}"')]
        assert not set(left) & migrated and len(left) == len(rows) - len(migrated)
        assert _ids(conn, f"{table}_migration_{summary.run_id.replace('-', '_')}") == migrated

        result = abort_migration(spark, str(out), summary.run_id)
        assert result.removed == len(migrated) and "restore.postgresql.sql" in result.note
        conn.execute(Path(summary.legacy_scripts, "restore.postgresql.sql").read_text())  # type: ignore[arg-type]
        assert len(_ids(conn, table)) == len(rows)
    assert Path(summary.legacy_scripts, "hide.sqlserver.sql").read_text().count("INSERT INTO #dd_migrated_ids") == 1
