"""``migrate run``: a resumable batch state machine that writes the selected rows to the target.

Valid rows are split into ``--batches`` batches by a hash of the message id; each batch is recorded in the
ledger as ``started`` then ``completed``. A rerun with the same arguments skips completed batches and rewrites
the rest; because message ids are the legacy ids, a batch written twice overwrites itself instead of duplicating.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.pipelines.bucket_target import BUCKET_SCHEME, bucket_sort_expression, with_run_time
from delayed_delivery.pipelines.ledger import BatchState, Ledger, RunManifest, RunState
from delayed_delivery.pipelines.legacy_sql import LegacyTable, default_legacy_table, write_scripts
from delayed_delivery.pipelines.migrate.load import LoadedSource, filtered, load_source, with_batch
from delayed_delivery.pipelines.migrate.options import MigrationOptions
from delayed_delivery.pipelines.migrate.write import read_refusals, write_partition
from delayed_delivery.pipelines.schema import to_epoch_us
from delayed_delivery.pipelines.targets import TargetSpec

__all__ = ["MigrationSummary", "run_migration"]

ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class MigrationSummary:
    """What a run did."""

    run_id: str
    target: str
    dry_run: bool
    to_migrate: int
    rejected: int
    batches: int
    batches_skipped: int
    batches_written: int
    rows_written: int
    already_due: int
    seconds: float
    refused: int
    rejects_path: str | None
    state: str
    #: Parquet of every id this run has written so far (all its completed batches, minus refusals).
    migrated_ids_path: str | None = None
    #: Folder of the SQL scripts that hide those ids from the legacy table (and restore them).
    legacy_scripts: str | None = None

    @property
    def rows_per_second(self) -> float:
        """Rows written per wall-clock second."""
        return self.rows_written / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class _Run:
    """One run's fixed facts, shared by its steps."""

    options: MigrationOptions
    spec: TargetSpec
    run_id: str
    output: str
    folder: Path
    now: datetime
    started: float


def run_migration(
    spark: Any,
    options: MigrationOptions,
    output: str,
    *,
    run_id: str | None = None,
    dry_run: bool = False,
    batch_size: int = 500,
    max_batches: int | None = None,
    now: datetime | None = None,
    on_progress: ProgressCallback | None = None,
    legacy_table: LegacyTable | None = None,
) -> MigrationSummary:
    """Migrate (or with ``dry_run`` only count) the selected rows; resumable by ``run_id``.

    Besides the target writes, a run leaves ``migrated-ids/`` and ``legacy/`` (SQL that hides the migrated
    rows from ``legacy_table``, by default the shape's usual table: see ``legacy_sql``) in its folder.
    """
    if not options.target:
        raise ConfigurationError("--target is required (e.g. sqlite:delays.db)")
    if batch_size < 1:
        raise ConfigurationError("--batch-size must be at least 1")
    spec = TargetSpec.parse(options.target)
    args = options.args()
    run_id = run_id or options.default_run_id()
    run = _Run(
        options, spec, run_id, output, RunManifest.folder(output, run_id), now or datetime.now(UTC), time.monotonic()
    )
    manifest = None if dry_run else RunManifest.open(output, run_id, args)
    loaded = load_source(spark, options)
    try:
        todo = with_batch(filtered(loaded.valid, options), options.batches, spec)
        rejected = loaded.rejects.count()
        if manifest is None:
            return _dry_run(run, todo, rejected)
        return _run(spark, run, manifest, loaded, todo, rejected, batch_size, max_batches, on_progress, legacy_table)
    finally:
        loaded.rows.unpersist()


def _dry_run(run: _Run, todo: Any, rejected: int) -> MigrationSummary:
    from pyspark.sql import functions as F

    due = F.sum(F.when(F.col("due_us") <= F.lit(to_epoch_us(run.now)), 1).otherwise(0))
    counts = todo.agg(F.count("*"), due).first()
    return MigrationSummary(
        run.run_id, run.spec.url, True, int(counts[0]), rejected, run.options.batches, 0, 0, 0,
        int(counts[1] or 0), time.monotonic() - run.started, 0, None, "dry-run",
    )  # fmt: skip


def _run(
    spark: Any,
    run: _Run,
    manifest: RunManifest,
    loaded: LoadedSource,
    todo: Any,
    rejected: int,
    batch_size: int,
    max_batches: int | None,
    on_progress: ProgressCallback | None,
    legacy_table: LegacyTable | None,
) -> MigrationSummary:
    """Write the rejects, then every pending batch, then the migrated ids, the legacy scripts and the summary."""
    rejects_path = str(run.folder / "rejects")
    loaded.rejects.write.mode("overwrite").json(rejects_path)
    ledger = Ledger(run.folder)
    done = frozenset(ledger.in_state(BatchState.COMPLETED))
    pending = sorted(set(range(run.options.batches)) - done)
    chosen = pending if max_batches is None else pending[:max_batches]
    _write_batches(run, ledger, todo, done, chosen, batch_size, on_progress)
    entries = ledger.entries()
    completed = {b for b in chosen if entries.get(b, {}).get("state") == BatchState.COMPLETED.value}
    written_now = [entries[b] for b in chosen if b in completed]
    if len(done) + len(written_now) == run.options.batches:
        manifest = manifest.with_state(run.output, RunState.COMPLETED)
    seconds = time.monotonic() - run.started
    legacy = _legacy_table(loaded, run.options, legacy_table)
    ids_path, scripts = _write_migrated_ids(spark, todo, sorted(done | completed), run.folder, run.run_id, legacy)
    summary = MigrationSummary(
        run_id=run.run_id,
        target=run.spec.url,
        dry_run=False,
        to_migrate=todo.count(),
        rejected=rejected,
        batches=run.options.batches,
        batches_skipped=len(done),
        batches_written=len(written_now),
        rows_written=sum(int(str(e.get("rows", 0))) for e in written_now),
        already_due=sum(int(str(e.get("already_due", 0))) for e in written_now),
        seconds=seconds,
        refused=sum(int(str(e.get("refused", 0))) for e in written_now),
        rejects_path=rejects_path,
        state=manifest.state.value,
        migrated_ids_path=ids_path,
        legacy_scripts=scripts,
    )
    (run.folder / "summary.json").write_text(
        json.dumps({**_asdict(summary), "rows_per_second": summary.rows_per_second})
    )
    return summary


def _write_batches(
    run: _Run,
    ledger: Ledger,
    todo: Any,
    done: frozenset[int],
    chosen: list[int],
    batch_size: int,
    on_progress: ProgressCallback | None,
) -> None:
    """Write the chosen batches on the executors (batches without rows are completed at once)."""
    to_write = todo.filter(todo["batch"].isin(chosen)) if chosen else todo.limit(0)
    per_batch = {int(r["batch"]): int(r["count"]) for r in to_write.groupBy("batch").count().collect()}
    for empty in set(chosen) - set(per_batch):
        ledger.mark(empty, BatchState.COMPLETED, rows=0, already_due=0)
    target = run.spec.build()
    try:
        target.prepare()
    finally:
        target.close()
    job = _ordered(to_write, run.spec, min(len(chosen), run.options.batches) or 1)
    spec, folder, now_us = run.spec, str(run.folder), to_epoch_us(run.now)
    if spec.scheme == BUCKET_SCHEME:  # every executor buckets against the run's start
        spec = with_run_time(spec, run.now)

    def work(rows: Iterator[Any]) -> None:
        write_partition(rows, spec, folder, batch_size, now_us, done)

    total = sum(per_batch.values())
    _run_with_progress(lambda: job.foreachPartition(work), ledger, set(chosen), total, on_progress)


def _ordered(to_write: Any, spec: TargetSpec, partitions: int) -> Any:
    """One partition per batch, in a total order: a checkpointing target resumes a batch by row position."""
    from pyspark.sql import functions as F

    order = ["batch"]
    group_by = bucket_sort_expression(spec) if spec.scheme == BUCKET_SCHEME else spec.sort_expression()
    if group_by is not None:  # e.g. the Azure shard, so consecutive rows fill one transaction
        to_write = to_write.withColumn("_group", F.expr(group_by))
        order.append("_group")
    order += ["message_id", "due_us"]
    return to_write.repartition(partitions, "batch").sortWithinPartitions(*order)


def _legacy_table(loaded: LoadedSource, options: MigrationOptions, given: LegacyTable | None) -> LegacyTable:
    """The legacy table the hide/restore scripts work on: the one given, else the shape's usual table."""
    id_column = loaded.mapping.columns["id"]
    legacy = given or default_legacy_table(loaded.mapping.shape, id_column, options.source_endpoint)
    if legacy.id_column is None:
        legacy = LegacyTable(legacy.table, id_column, legacy.schema)
    return legacy


def _write_migrated_ids(
    spark: Any, todo: Any, batches: Sequence[int], folder: Path, run_id: str, legacy: LegacyTable
) -> tuple[str, str]:
    """Write ``migrated-ids/`` (Parquet) and the legacy hide/restore scripts for the completed batches."""
    from pyspark.sql import functions as F

    refused = sorted({m for m, _ in read_refusals(folder)})
    rows = todo.filter(F.col("batch").isin(list(batches))) if batches else todo.limit(0)
    if refused:
        rows = rows.join(spark.createDataFrame([(m,) for m in refused], "message_id string"), "message_id", "left_anti")
    ids_path = str(folder / "migrated-ids")
    rows.select("message_id", "endpoint", "destination", "due_us", "batch").dropDuplicates(["message_id"]).write.mode(
        "overwrite"
    ).parquet(ids_path)
    ids = [r[0] for r in spark.read.parquet(ids_path).select("message_id").orderBy("message_id").toLocalIterator()]
    scripts = folder / "legacy"
    write_scripts(scripts, legacy, run_id, ids)
    return ids_path, str(scripts)


def _asdict(obj: Any) -> dict[str, object]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def _completed_rows(ledger: Ledger, chosen: set[int]) -> int:
    entries = ledger.entries()
    completed = BatchState.COMPLETED.value
    return sum(int(str(e.get("rows", 0))) for b, e in entries.items() if b in chosen and e.get("state") == completed)


def _run_with_progress(
    action: Callable[[], None],
    ledger: Ledger,
    chosen: set[int],
    total: int,
    on_progress: ProgressCallback | None,
) -> None:
    """Run the Spark action in a thread; report rows of completed batches (read from the ledger) meanwhile."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            action()
        except BaseException as exc:  # re-raised on the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="migrate-job", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
        if on_progress is not None:
            on_progress(_completed_rows(ledger, chosen), total)
    if failure:
        raise failure[0]
    if on_progress is not None:
        on_progress(total, total)
