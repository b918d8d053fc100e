"""Migration into the PostgreSQL store and the Azure delays table (Azurite), through the adapters' own APIs."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.pipelines.migrate import MigrationOptions, abort_migration, run_migration
from delayed_delivery.pipelines.schema import LegacyShape
from delayed_delivery.pipelines.synthetic import DEFAULT_NOW, write_legacy_export
from delayed_delivery.pipelines.targets import DEFAULT_AZURE_CONNECTION_ENV, TargetSpec

NOW = DEFAULT_NOW


def _migrate_rerun_abort(spark: Any, tmp_path: Path, target: str, count: Any) -> None:
    export = write_legacy_export(tmp_path / "src", LegacyShape.TIMEOUT_MANAGER, 120, malformed_every=30, seed=5)
    out = str(tmp_path / "out")
    opts = MigrationOptions(source=export.path, target=target, batches=3)
    first = run_migration(spark, opts, out, batch_size=25, now=NOW)
    assert (first.rows_written, first.rejected, first.state) == (116, 4, "completed")
    assert count() == 116
    # Another run of the same rows: deterministic ids/keys overwrite, nothing is duplicated.
    again = run_migration(spark, opts, out, run_id="again", batch_size=25, now=NOW)
    assert again.rows_written == 116 and count() == 116
    result = abort_migration(spark, out, "again", target)
    assert (result.undone, result.removed, result.already_gone) == (True, 116, 0)
    assert count() == 0


@pytest.mark.spark
@pytest.mark.postgres
def test_migrate_into_postgres_reruns_without_duplicates_and_aborts(
    spark: Any, postgres_conninfo: str, postgres_table: str, tmp_path: Path
) -> None:
    from delayed_delivery.postgres.store import PostgresDelayedMessageStore

    kv = dict(part.split("=", 1) for part in postgres_conninfo.split())
    target = f"postgresql://{kv['user']}@{kv['host']}:{kv['port']}/{kv['dbname']}?table={postgres_table}"
    store = PostgresDelayedMessageStore(postgres_conninfo, table=postgres_table)
    try:
        _migrate_rerun_abort(spark, tmp_path, target, lambda: len(store))
    finally:
        store.close()
    spec = TargetSpec.parse("postgresql://u:secret@h:5/db?table=t&sslmode=require")
    assert spec.url == "postgresql://u:***@h:5/db?table=t"  # what run.json records
    assert spec.secret == "postgresql://u:secret@h:5/db?sslmode=require" and "secret" not in repr(spec)


@pytest.mark.spark
@pytest.mark.azurite
def test_migrate_into_the_azure_table_reruns_without_duplicates_and_aborts(
    spark: Any, azurite: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayed_delivery.azure.table_store import TableDelayedMessageStore

    table = "mig" + uuid.uuid4().hex[:12]
    monkeypatch.delenv(DEFAULT_AZURE_CONNECTION_ENV, raising=False)
    with pytest.raises(ConfigurationError, match=DEFAULT_AZURE_CONNECTION_ENV):
        TargetSpec.parse(f"azure-table:{table}")
    monkeypatch.setenv(DEFAULT_AZURE_CONNECTION_ENV, azurite.connection_string)
    store = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table, shards=4)
    _migrate_rerun_abort(spark, tmp_path, f"azure-table:{table}?shards=4", store.count)
    # A row that was already due is fetchable at once.
    export = write_legacy_export(tmp_path / "due", LegacyShape.DELAYED_STORE, 50, seed=9)
    run_migration(spark, MigrationOptions(source=export.path, target=f"azure-table:{table}?shards=4"), str(tmp_path))
    due = store.fetch_due(NOW + timedelta(seconds=1), 100)
    assert due and all(m.due_at <= NOW for m in due)


def test_store_target_refuses_repeated_and_conflicting_ids_and_stores_the_rest(tmp_path) -> None:
    """A repeated id in one batch keeps the later copy; an id pending with other content is a reject, not a crash."""
    from datetime import UTC, datetime, timedelta

    from delayed_delivery import DelayedMessage, SqliteDelayedMessageStore
    from delayed_delivery.pipelines.targets import StoreTarget

    store = SqliteDelayedMessageStore(tmp_path / "t.db")
    target = StoreTarget(store)
    target.prepare()
    soon = datetime.now(UTC) + timedelta(days=1)
    pending = DelayedMessage("taken", "orders", b"old", soon)
    store.store(pending)
    batch = [
        DelayedMessage("a", "orders", b"a1", soon),
        DelayedMessage("a", "orders", b"a2", soon + timedelta(hours=1)),
        DelayedMessage("taken", "orders", b"new", soon),
        DelayedMessage("b", "orders", b"b", soon),
    ]
    refused = dict(target.write(batch))
    assert set(refused) == {"a", "taken"}
    assert "repeated" in refused["a"] and "taken" in refused["taken"]
    assert len(store) == 3
    assert target.write([DelayedMessage("b", "orders", b"b", soon)]) == []  # the same again: a no-op
    target.close()
