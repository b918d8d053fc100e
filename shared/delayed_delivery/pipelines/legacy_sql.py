"""SQL scripts that hide migrated timeouts from the legacy store, and bring them back (pure Python, no Spark).

The NServiceBus timeout migration tool hides the rows it migrated so the legacy timeout manager cannot deliver them a
second time (SQL persistence moves them into ``TimeoutData_migration_<run>``). Our sources are exports,
so the job cannot touch the legacy database itself; instead ``run`` writes, next to ``migrated-ids/``:

``legacy/hide.<dialect>.sql``
    In one transaction: load the migrated ids into a temporary table, copy the matching legacy rows into
    ``<table>_migration_<run>`` (created like the legacy table if missing) and delete them from the legacy
    table. Safe to run again: rows already moved are no longer in the legacy table.
``legacy/restore.<dialect>.sql``
    The inverse, for an aborted migration: put the moved rows back and drop the migration table.

Dialects: ``postgresql`` (executed against PostgreSQL in the tests) and ``sqlserver`` (same statements in
T-SQL; not executed in CI, which has no SQL Server). Ids are compared as lowercase text, so a
``uniqueidentifier``/``uuid`` column matches an export that printed it in either case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ..errors import ConfigurationError
from .schema import LegacyShape

__all__ = ["Dialect", "LegacyTable", "default_legacy_table", "hide_script", "restore_script", "write_scripts"]

#: Ids per ``INSERT … VALUES`` statement (SQL Server's limit for a row-value list is 1,000).
_VALUES_PER_INSERT = 1000


class Dialect(StrEnum):
    """The legacy database's SQL dialect."""

    POSTGRESQL = "postgresql"
    SQLSERVER = "sqlserver"


@dataclass(frozen=True, slots=True)
class LegacyTable:
    """Where the legacy timeouts live: table, optional schema, and the id column's name."""

    table: str
    #: None: the export's id column (the job fills it in from the column mapping).
    id_column: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        for name in (self.table, self.id_column or "Id", self.schema or "x"):
            if not name or any(c in name for c in '"[]`;\x00\n\r'):
                raise ConfigurationError(f"legacy table, schema and column names cannot contain quotes: {name!r}")


def default_legacy_table(shape: LegacyShape, id_column: str, source_endpoint: str | None) -> LegacyTable:
    """``TimeoutData`` for the timeout manager; ``<endpoint>.timeouts`` for the delayed-message store."""
    if shape is LegacyShape.TIMEOUT_MANAGER:
        return LegacyTable("TimeoutData", id_column)
    return LegacyTable(f"{source_endpoint or 'endpoint'}.timeouts", id_column)


def _suffix(run_id: str) -> str:
    """The run id as an identifier part: lowercase letters, digits and ``_``."""
    return re.sub(r"[^a-z0-9_]", "_", run_id.lower())[:60]


def _q(dialect: Dialect, name: str) -> str:
    return f'"{name}"' if dialect is Dialect.POSTGRESQL else f"[{name}]"


def _qualified(dialect: Dialect, schema: str | None, name: str) -> str:
    return f"{_q(dialect, schema)}.{_q(dialect, name)}" if schema else _q(dialect, name)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _id_inserts(dialect: Dialect, ids: Iterable[str]) -> Iterator[str]:
    chunk: list[str] = []
    for message_id in ids:
        chunk.append(_literal(message_id.lower()))
        if len(chunk) == _VALUES_PER_INSERT:
            yield _insert(dialect, chunk)
            chunk = []
    if chunk:
        yield _insert(dialect, chunk)


def _insert(dialect: Dialect, literals: list[str]) -> str:
    if dialect is Dialect.POSTGRESQL:
        values = ",".join(f"({v})" for v in literals)
        return f"INSERT INTO dd_migrated_ids (id) VALUES {values} ON CONFLICT DO NOTHING;\n"
    values = ",".join(f"(N{v})" for v in literals)
    return (
        f"INSERT INTO #dd_migrated_ids (id) SELECT DISTINCT v.id FROM (VALUES {values}) AS v(id) "
        "WHERE v.id NOT IN (SELECT id FROM #dd_migrated_ids);\n"
    )


def hide_script(dialect: Dialect, legacy: LegacyTable, run_id: str, ids: Iterable[str]) -> Iterator[str]:
    """The hide script for ``ids``, as text pieces (ids streamed, so millions never sit in memory at once)."""
    table = _qualified(dialect, legacy.schema, legacy.table)
    moved = _qualified(dialect, legacy.schema, f"{legacy.table}_migration_{_suffix(run_id)}")
    col = _q(dialect, legacy.id_column or "Id")
    yield (
        f"-- delayed-delivery migrate: hide the timeouts migrated by run {run_id} from {table}.\n"
        f"-- Moves them into {moved}; legacy/restore.{dialect.value}.sql moves them back.\n"
        "-- Stop the legacy timeout manager first. Safe to run again.\n"
    )
    if dialect is Dialect.POSTGRESQL:
        yield "BEGIN;\nCREATE TEMPORARY TABLE dd_migrated_ids (id text PRIMARY KEY) ON COMMIT DROP;\n"
        yield from _id_inserts(dialect, ids)
        yield (
            f"CREATE TABLE IF NOT EXISTS {moved} (LIKE {table} INCLUDING ALL);\n"
            f"INSERT INTO {moved} SELECT t.* FROM {table} t JOIN dd_migrated_ids m ON lower(t.{col}::text) = m.id;\n"
            f"DELETE FROM {table} t USING dd_migrated_ids m WHERE lower(t.{col}::text) = m.id;\n"
            "COMMIT;\n"
        )
        return
    yield (
        "SET XACT_ABORT ON;\nBEGIN TRANSACTION;\n"
        "CREATE TABLE #dd_migrated_ids (id nvarchar(400) COLLATE Latin1_General_BIN2 PRIMARY KEY);\n"
    )
    yield from _id_inserts(dialect, ids)
    yield (
        f"IF OBJECT_ID(N{_literal(moved)}) IS NULL SELECT TOP 0 * INTO {moved} FROM {table};\n"
        f"INSERT INTO {moved} SELECT t.* FROM {table} t JOIN #dd_migrated_ids m "
        f"ON LOWER(CONVERT(nvarchar(400), t.{col})) = m.id;\n"
        f"DELETE t FROM {table} t JOIN #dd_migrated_ids m ON LOWER(CONVERT(nvarchar(400), t.{col})) = m.id;\n"
        "COMMIT TRANSACTION;\nDROP TABLE #dd_migrated_ids;\n"
    )


def restore_script(dialect: Dialect, legacy: LegacyTable, run_id: str) -> str:
    """The inverse of ``hide_script``: the moved rows go back to the legacy table, the migration table goes."""
    table = _qualified(dialect, legacy.schema, legacy.table)
    moved = _qualified(dialect, legacy.schema, f"{legacy.table}_migration_{_suffix(run_id)}")
    head = (
        f"-- delayed-delivery migrate: give back to {table} the timeouts run {run_id} hid in {moved}.\n"
        "-- Only after `delayed-delivery migrate abort` removed them from the new store, or both would deliver.\n"
    )
    if dialect is Dialect.POSTGRESQL:
        return head + f"BEGIN;\nINSERT INTO {table} SELECT * FROM {moved};\nDROP TABLE {moved};\nCOMMIT;\n"
    return head + (
        f"SET XACT_ABORT ON;\nBEGIN TRANSACTION;\nINSERT INTO {table} SELECT * FROM {moved};\n"
        f"DROP TABLE {moved};\nCOMMIT TRANSACTION;\n"
    )


def write_scripts(folder: str | Path, legacy: LegacyTable, run_id: str, ids: Iterable[str]) -> list[Path]:
    """Write hide and restore scripts for every dialect under ``folder``; the paths written."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    id_list = ids if isinstance(ids, list) else list(ids)
    written: list[Path] = []
    for dialect in Dialect:
        hide = out / f"hide.{dialect.value}.sql"
        tmp = hide.with_name(f".{hide.name}.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            fh.writelines(hide_script(dialect, legacy, run_id, id_list))
        tmp.replace(hide)
        restore = out / f"restore.{dialect.value}.sql"
        restore.write_text(restore_script(dialect, legacy, run_id), encoding="utf-8")
        written += [hide, restore]
    return written
