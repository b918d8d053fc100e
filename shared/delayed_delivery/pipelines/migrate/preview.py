"""``migrate preview``: what a run with these options would migrate, without writing anything but a chart."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from delayed_delivery.pipelines.migrate.load import LoadedSource, filtered, from_epoch_us, load_source
from delayed_delivery.pipelines.migrate.options import MigrationOptions
from delayed_delivery.pipelines.schema import to_epoch_us

__all__ = ["DUE_SOON_WINDOW", "DestinationCount", "PreviewResult", "preview_migration"]

#: Timeouts due within this window trigger the preview warning (4 hours, as NServiceBus's migration tool warns).
DUE_SOON_WINDOW = timedelta(hours=4)

_HOUR_US = 3_600 * 1_000_000


@dataclass(frozen=True, slots=True)
class DestinationCount:
    """Timeouts for one endpoint and destination."""

    endpoint: str
    destination: str
    count: int
    earliest_due: datetime
    latest_due: datetime


@dataclass(frozen=True, slots=True)
class PreviewResult:
    """What a run with these options would migrate."""

    total_rows: int
    to_migrate: int
    rejected: int
    before_cutoff: int
    other_endpoints: int
    already_due: int
    due_soon: int
    earliest_due: datetime | None
    latest_due: datetime | None
    by_destination: tuple[DestinationCount, ...]
    rejects_by_reason: tuple[tuple[str, int], ...]
    histogram: tuple[tuple[datetime, int], ...]
    bucket: str
    chart: str | None
    warning: str | None


def preview_migration(
    spark: Any, options: MigrationOptions, output: str | None = None, *, now: datetime | None = None
) -> PreviewResult:
    """Counts per endpoint and destination, due extremes, the 4-hour warning and a due-date histogram."""
    now = now or datetime.now(UTC)
    loaded = load_source(spark, options)
    try:
        return _preview(loaded, options, output, now)
    finally:
        loaded.rows.unpersist()


def _preview(loaded: LoadedSource, options: MigrationOptions, output: str | None, now: datetime) -> PreviewResult:
    from pyspark.sql import functions as F

    valid_count, before_cutoff = _valid_and_before_cutoff(loaded.valid, options)
    rejects = loaded.rejects.groupBy("reason").count().orderBy(F.desc("count"), "reason").collect()
    picked = filtered(loaded.valid, options)
    totals = _totals(picked, now)
    n, lo, hi = int(totals["n"]), totals["lo"], totals["hi"]
    bucket, width_us = _bucket(lo, hi)
    histogram = _histogram(picked, width_us) if n else ()
    already_due, due_soon = int(totals["due_now"] or 0), int(totals["soon"] or 0)
    total_rows = valid_count + sum(int(r["count"]) for r in rejects)
    return PreviewResult(
        total_rows=total_rows,
        to_migrate=n,
        rejected=total_rows - valid_count,
        before_cutoff=before_cutoff,
        other_endpoints=valid_count - before_cutoff - n,
        already_due=already_due,
        due_soon=due_soon,
        earliest_due=from_epoch_us(lo) if lo is not None else None,
        latest_due=from_epoch_us(hi) if hi is not None else None,
        by_destination=_by_destination(picked),
        rejects_by_reason=tuple((r["reason"], int(r["count"])) for r in rejects),
        histogram=histogram,
        bucket=bucket,
        chart=_chart(output, histogram, bucket, width_us),
        warning=_warning(already_due, due_soon),
    )


def _valid_and_before_cutoff(valid: Any, options: MigrationOptions) -> tuple[int, int]:
    """Valid rows, and how many of them the cutoff leaves behind."""
    from pyspark.sql import functions as F

    if options.cutoff is None:
        before = F.lit(0)
    else:
        before = F.sum(F.when(F.col("due_us") <= F.lit(to_epoch_us(options.cutoff)), 1).otherwise(0))
    stats = valid.agg(F.count("*").alias("valid"), before.alias("before_cutoff")).first()
    return int(stats["valid"]), int(stats["before_cutoff"] or 0)


def _totals(picked: Any, now: datetime) -> Any:
    """Count, earliest and latest due, already due and due within the warning window, in one pass."""
    from pyspark.sql import functions as F

    now_us, soon_us = to_epoch_us(now), to_epoch_us(now + DUE_SOON_WINDOW)
    due = F.col("due_us")
    return picked.agg(
        F.count("*").alias("n"),
        F.min("due_us").alias("lo"),
        F.max("due_us").alias("hi"),
        F.sum(F.when(due <= now_us, 1).otherwise(0)).alias("due_now"),
        F.sum(F.when((due > now_us) & (due <= soon_us), 1).otherwise(0)).alias("soon"),
    ).first()


def _by_destination(picked: Any) -> tuple[DestinationCount, ...]:
    from pyspark.sql import functions as F

    groups = (
        picked.groupBy("endpoint", "destination")
        .agg(F.count("*").alias("n"), F.min("due_us").alias("lo"), F.max("due_us").alias("hi"))
        .orderBy("endpoint", "destination")
        .collect()
    )
    return tuple(
        DestinationCount(r["endpoint"], r["destination"], int(r["n"]), from_epoch_us(r["lo"]), from_epoch_us(r["hi"]))
        for r in groups
    )


def _histogram(picked: Any, width_us: int) -> tuple[tuple[datetime, int], ...]:
    from pyspark.sql import functions as F

    rows = picked.groupBy(F.floor(F.col("due_us") / F.lit(width_us)).alias("b")).count().orderBy("b").collect()
    return tuple((from_epoch_us(int(r["b"]) * width_us), int(r["count"])) for r in rows)


def _warning(already_due: int, due_soon: int) -> str | None:
    if not (already_due or due_soon):
        return None
    return (
        f"{due_soon} timeout(s) are due within the next 4 hours and {already_due} are already due: stop the "
        "legacy timeout manager before migrating, or they may be delivered twice"
    )


def _chart(output: str | None, histogram: tuple[tuple[datetime, int], ...], bucket: str, width_us: int) -> str | None:
    """Draw the due-date histogram under ``output``/preview; None without an output folder or rows."""
    if output is None or not histogram:
        return None
    from delayed_delivery.pipelines.charts import bar_chart

    chart = str(Path(output) / "preview" / "due_histogram.png")
    bar_chart(
        chart,
        [t for t, _ in histogram],
        [c for _, c in histogram],
        title=f"Timeouts to migrate by due {bucket}",
        ylabel="timeouts",
        width_days=width_us / 86_400e6,
    )
    return chart


def _bucket(lo: int | None, hi: int | None) -> tuple[str, int]:
    span = (hi - lo) if lo is not None and hi is not None else 0
    if span <= 3 * 24 * _HOUR_US:
        return "hour", _HOUR_US
    if span <= 400 * 24 * _HOUR_US:
        return "day", 24 * _HOUR_US
    return "week", 7 * 24 * _HOUR_US
