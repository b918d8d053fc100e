"""``migrate abort``: take back what a run wrote where the target allows it, and mark the run aborted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.pipelines.ledger import BatchState, Ledger, RunManifest, RunState
from delayed_delivery.pipelines.migrate.load import filtered, load_source, with_batch
from delayed_delivery.pipelines.migrate.options import MigrationOptions
from delayed_delivery.pipelines.targets import TargetSpec

__all__ = ["AbortResult", "abort_migration"]

#: Ids per ``undo`` call on the executors.
_UNDO_CHUNK = 500


@dataclass(frozen=True, slots=True)
class AbortResult:
    """What an abort took back, or why it could not."""

    run_id: str
    target: str
    undone: bool
    batches: int
    removed: int
    already_gone: int
    note: str


def abort_migration(spark: Any, output: str, run_id: str, target: str | None = None) -> AbortResult:
    """Remove what run ``run_id`` wrote where the target allows it, and mark the run aborted.

    ``target`` supplies credentials the run's files do not record (a database password); it must
    name the same target as the run.
    """
    manifest = RunManifest.load(output, run_id)
    if manifest is None:
        raise ConfigurationError(f"no run {run_id!r} under {output!r} (look in {Path(output) / 'runs'})")
    options = MigrationOptions.from_args(dict(manifest.args))
    spec = TargetSpec.parse(target or options.target)
    if spec.url != options.target:
        raise ConfigurationError(f"--target {spec.url!r} is not the run's target {options.target!r}")
    folder = RunManifest.folder(output, run_id)
    ledger = Ledger(folder)
    touched = sorted(ledger.in_state(BatchState.STARTED) | ledger.in_state(BatchState.COMPLETED))
    refusal = _cannot_undo(spec)
    if refusal is not None:
        return AbortResult(run_id, spec.url, False, len(touched), 0, 0, refusal)
    expected, removed = _undo(spark, options, spec, touched)
    for batch in touched:
        ledger.mark(batch, BatchState.ABORTED)
    manifest.with_state(output, RunState.ABORTED)
    note = f"removed {removed} message(s); {expected - removed} were already delivered or gone"
    if (folder / "legacy").is_dir():
        note += (
            "; if you ran legacy/hide.<dialect>.sql, give the rows back with "
            f"{folder / 'legacy'}/restore.postgresql.sql (or restore.sqlserver.sql)"
        )
    return AbortResult(run_id, spec.url, True, len(touched), removed, expected - removed, note)


def _cannot_undo(spec: TargetSpec) -> str | None:
    """Why the target cannot take back what was written, or None when it can."""
    built = spec.build()
    try:
        if built.can_undo:
            return None
        return str(getattr(built, "undo_note", f"the {spec.scheme} target cannot take back what was written"))
    finally:
        built.close()


def _undo(spark: Any, options: MigrationOptions, spec: TargetSpec, touched: list[int]) -> tuple[int, int]:
    """Remove the ids of the touched batches on the executors: (ids expected, ids actually removed)."""
    if not touched:
        return 0, 0
    loaded = load_source(spark, options)
    try:
        rows = with_batch(filtered(loaded.valid, options), options.batches, spec)
        mine = rows.filter(rows["batch"].isin(touched))
        expected = mine.count()
        removed = spark.sparkContext.accumulator(0)

        def undo(part: Iterator[Any]) -> None:
            removed.add(_undo_partition(spec, (r["message_id"] for r in part)))

        mine.select("message_id").foreachPartition(undo)
        return expected, int(removed.value)
    finally:
        loaded.rows.unpersist()


def _undo_partition(spec: TargetSpec, ids: Iterator[str]) -> int:
    """Undo one partition's ids in chunks; the number removed."""
    target = spec.build()
    removed = 0
    try:
        chunk: list[str] = []
        for message_id in ids:
            chunk.append(message_id)
            if len(chunk) >= _UNDO_CHUNK:
                removed += target.undo(chunk)
                chunk = []
        if chunk:
            removed += target.undo(chunk)
    finally:
        target.close()
    return removed
