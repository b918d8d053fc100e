"""Spark job: migrate legacy timeouts into native delayed delivery (preview, run, abort).

Run with ``spark-submit shared/delayed_delivery/pipelines/migrate.py run --source … --target …``,
``python -m delayed_delivery.pipelines.migrate …`` or ``delayed-delivery migrate …``.

The run is a resumable batch state machine: valid rows are split into ``--batches`` batches by a
hash of the message id; each batch is recorded in the ledger as ``started`` then ``completed``.
A rerun with the same arguments skips completed batches and rewrites the rest; because message ids
are the legacy ids, a batch written twice overwrites itself instead of duplicating.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import groupby
from pathlib import Path
from typing import Any

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.model import DelayedMessage, Headers
from delayed_delivery.pipelines.ledger import BatchState, Ledger, RunManifest, RunState, fingerprint
from delayed_delivery.pipelines.legacy_sql import LegacyTable, default_legacy_table, write_scripts
from delayed_delivery.pipelines.schema import (
    BodyEncoding,
    ColumnMapping,
    LegacyShape,
    Reject,
    detect_shape,
    normalize_row,
    to_epoch_us,
)
from delayed_delivery.pipelines.targets import MigrationTarget, TargetSpec

__all__ = [
    "DUE_SOON_WINDOW",
    "AbortResult",
    "MigrationOptions",
    "MigrationSummary",
    "PreviewResult",
    "abort_migration",
    "load_source",
    "preview_migration",
    "run_migration",
]

#: Timeouts due within this window trigger the preview warning (the seed tool's 4 hours).
DUE_SOON_WINDOW = timedelta(hours=4)
_FORMATS = {"parquet": "parquet", "csv": "csv", "json": "json", "jsonl": "json", "ndjson": "json"}


@dataclass(frozen=True, slots=True)
class MigrationOptions:
    """Everything that decides which rows a run migrates, and where."""

    source: str
    target: str = ""
    source_format: str | None = None
    shape: LegacyShape | None = None
    body_encoding: BodyEncoding = BodyEncoding.BASE64
    source_endpoint: str | None = None
    cutoff: datetime | None = None
    endpoints: tuple[str, ...] = ()
    batches: int = 16

    def __post_init__(self) -> None:
        if self.batches < 1 or self.batches > 100_000:
            raise ConfigurationError("--batches must be between 1 and 100000")
        if self.cutoff is not None and self.cutoff.tzinfo is None:
            object.__setattr__(self, "cutoff", self.cutoff.replace(tzinfo=UTC))

    def format(self) -> str:
        """The source format, from the option or the file extension."""
        if self.source_format:
            fmt = _FORMATS.get(self.source_format.lower())
            if fmt is None:
                raise ConfigurationError(f"unknown --format {self.source_format!r}: use parquet, csv or json")
            return fmt
        path = Path(self.source)
        candidates = [path] if path.is_file() else sorted(p for p in path.glob("*") if p.is_file())
        for candidate in candidates:
            fmt = _FORMATS.get(candidate.suffix.lstrip(".").lower())
            if fmt is not None:
                return fmt
        raise ConfigurationError(f"cannot tell the format of {self.source!r}: pass --format parquet|csv|json")

    def args(self) -> dict[str, str]:
        """The arguments that identify a run (compared on resume)."""
        return {
            "source": str(Path(self.source).resolve()),
            "target": TargetSpec.parse(self.target).url if self.target else "",
            "format": self.format(),
            "shape": self.shape.value if self.shape else "auto",
            "body_encoding": self.body_encoding.value,
            "source_endpoint": self.source_endpoint or "",
            "cutoff": self.cutoff.isoformat() if self.cutoff else "",
            "endpoints": ",".join(sorted(self.endpoints)),
            "batches": str(self.batches),
        }

    @classmethod
    def from_args(cls, args: dict[str, str]) -> MigrationOptions:
        """Rebuild the options a run was started with."""
        return cls(
            source=args["source"],
            target=args["target"],
            source_format=args["format"],
            shape=None if args["shape"] == "auto" else LegacyShape(args["shape"]),
            body_encoding=BodyEncoding(args["body_encoding"]),
            source_endpoint=args["source_endpoint"] or None,
            cutoff=datetime.fromisoformat(args["cutoff"]) if args["cutoff"] else None,
            endpoints=tuple(e for e in args["endpoints"].split(",") if e),
            batches=int(args["batches"]),
        )

    def default_run_id(self) -> str:
        """``run-`` plus a hash of the arguments, so the same arguments resume the same run."""
        return "run-" + fingerprint(self.args())[:12]


# -- reading and mapping ---------------------------------------------------------------------------

_ROW_FIELDS = (
    "ok",
    "message_id",
    "destination",
    "body",
    "due_us",
    "headers_json",
    "failure_count",
    "endpoint",
    "reason",
    "raw",
)


def _schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("ok", T.BooleanType(), False),
            T.StructField("message_id", T.StringType()),
            T.StructField("destination", T.StringType()),
            T.StructField("body", T.BinaryType()),
            T.StructField("due_us", T.LongType()),
            T.StructField("headers_json", T.StringType()),
            T.StructField("failure_count", T.IntegerType()),
            T.StructField("endpoint", T.StringType()),
            T.StructField("reason", T.StringType()),
            T.StructField("raw", T.StringType()),
        ]
    )


def _raw_json(row: dict[str, object]) -> str:
    import base64

    def plain(v: object) -> object:
        if isinstance(v, bytes | bytearray):
            return "base64:" + base64.b64encode(bytes(v)).decode()
        return v if isinstance(v, str | int | float | bool | type(None)) else str(v)

    return json.dumps({k: plain(v) for k, v in row.items()}, ensure_ascii=False, sort_keys=True)


def _normalize_partition(rows: Iterable[Any], mapping: ColumnMapping, json_text: bool) -> Iterator[tuple[Any, ...]]:
    for row in rows:
        if json_text:
            line = row[0]
            if not line or not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError:
                yield (False, None, None, None, None, None, None, None, "malformed JSON line", line)
                continue
            if not isinstance(data, dict):
                yield (False, None, None, None, None, None, None, None, "JSON line is not an object", line)
                continue
        else:
            data = row.asDict()
        result = normalize_row(data, mapping)
        if isinstance(result, Reject):
            yield (False, None, None, None, None, None, None, None, result.reason, _raw_json(data))
        else:
            yield (
                True,
                result.message_id,
                result.destination,
                result.body,
                result.due_us,
                result.headers_json,
                result.failure_count,
                result.endpoint,
                None,
                None,
            )


@dataclass(frozen=True, slots=True)
class LoadedSource:
    """The source mapped: every row, valid or rejected, in one cached DataFrame."""

    rows: Any
    mapping: ColumnMapping

    @property
    def valid(self) -> Any:
        """Rows that can be migrated."""
        return self.rows.filter("ok")

    @property
    def rejects(self) -> Any:
        """Rows that cannot, with ``reason`` and the original row as JSON in ``raw``."""
        return self.rows.filter("NOT ok").select("reason", "raw")


def load_source(spark: Any, options: MigrationOptions) -> LoadedSource:
    """Read the export and map it to the native model; malformed rows become rejects."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fmt = options.format()
    if not Path(options.source).exists():
        raise ConfigurationError(f"source {options.source!r} does not exist")
    json_text = fmt == "json"
    if fmt == "parquet":
        df = spark.read.parquet(options.source)
        for f in df.schema.fields:
            if isinstance(f.dataType, T.TimestampType | T.TimestampNTZType):
                df = df.withColumn(f.name, F.date_format(F.col(f.name), "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"))
        columns = list(df.columns)
    elif fmt == "csv":
        df = (
            spark.read.option("header", True)
            .option("escape", '"')
            .option("mode", "PERMISSIVE")
            .option("inferSchema", False)
            .csv(options.source)
        )
        columns = list(df.columns)
    else:
        df = spark.read.text(options.source)
        columns = _json_columns(df.limit(200).collect())
    shape = options.shape or detect_shape(columns)
    mapping = ColumnMapping.for_columns(shape, columns, options.body_encoding, options.source_endpoint)
    rdd = df.rdd.mapPartitions(lambda rows: _normalize_partition(rows, mapping, json_text))
    mapped = spark.createDataFrame(rdd, _schema()).persist()
    return LoadedSource(mapped, mapping)


def _json_columns(sample: Sequence[Any]) -> list[str]:
    columns: dict[str, None] = {}
    for row in sample:
        try:
            data = json.loads(row[0])
        except (ValueError, TypeError):
            continue
        if isinstance(data, dict):
            columns.update(dict.fromkeys(data))
    return list(columns)


def _filtered(valid: Any, options: MigrationOptions) -> Any:
    from pyspark.sql import functions as F

    if options.cutoff is not None:
        valid = valid.filter(F.col("due_us") > F.lit(to_epoch_us(options.cutoff)))
    if options.endpoints:
        valid = valid.filter(F.col("endpoint").isin(list(options.endpoints)))
    return valid


def _with_batch(valid: Any, batches: int) -> Any:
    from pyspark.sql import functions as F

    return valid.withColumn("batch", F.pmod(F.xxhash64("message_id"), F.lit(batches)).cast("int"))


# -- preview ---------------------------------------------------------------------------------------


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


def _dt(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(us))


def preview_migration(
    spark: Any, options: MigrationOptions, output: str | None = None, *, now: datetime | None = None
) -> PreviewResult:
    """Counts per endpoint and destination, due extremes, the 4-hour warning and a due-date histogram."""
    from pyspark.sql import functions as F

    now = now or datetime.now(UTC)
    loaded = load_source(spark, options)
    try:
        return _preview(loaded, options, output, now, F)
    finally:
        loaded.rows.unpersist()


def _preview(
    loaded: LoadedSource, options: MigrationOptions, output: str | None, now: datetime, F: Any
) -> PreviewResult:
    valid = loaded.valid
    now_us, soon_us = to_epoch_us(now), to_epoch_us(now + DUE_SOON_WINDOW)
    cutoff_us = to_epoch_us(options.cutoff) if options.cutoff else None
    stats = valid.agg(
        F.count("*").alias("valid"),
        F.sum(F.when(F.col("due_us") <= F.lit(cutoff_us), 1).otherwise(0)).alias("before_cutoff")
        if cutoff_us is not None
        else F.lit(0).alias("before_cutoff"),
    ).first()
    rejects = loaded.rejects.groupBy("reason").count().orderBy(F.desc("count"), "reason").collect()
    picked = _filtered(valid, options)
    groups = (
        picked.groupBy("endpoint", "destination")
        .agg(F.count("*").alias("n"), F.min("due_us").alias("lo"), F.max("due_us").alias("hi"))
        .orderBy("endpoint", "destination")
        .collect()
    )
    totals = picked.agg(
        F.count("*").alias("n"),
        F.min("due_us").alias("lo"),
        F.max("due_us").alias("hi"),
        F.sum(F.when(F.col("due_us") <= now_us, 1).otherwise(0)).alias("due_now"),
        F.sum(F.when((F.col("due_us") > now_us) & (F.col("due_us") <= soon_us), 1).otherwise(0)).alias("soon"),
    ).first()
    n = int(totals["n"])
    lo, hi = totals["lo"], totals["hi"]
    bucket, width_us = _bucket(lo, hi)
    histogram: tuple[tuple[datetime, int], ...] = ()
    if n:
        hist_rows = picked.groupBy(F.floor(F.col("due_us") / F.lit(width_us)).alias("b")).count().orderBy("b").collect()
        histogram = tuple((_dt(int(r["b"]) * width_us), int(r["count"])) for r in hist_rows)
    already_due, due_soon = int(totals["due_now"] or 0), int(totals["soon"] or 0)
    warning = None
    if already_due or due_soon:
        warning = (
            f"{due_soon} timeout(s) are due within the next 4 hours and {already_due} are already due: stop the "
            "legacy timeout manager before migrating, or they may be delivered twice"
        )
    total_rows = int(stats["valid"]) + sum(int(r["count"]) for r in rejects)
    chart = None
    if output is not None and histogram:
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
    return PreviewResult(
        total_rows=total_rows,
        to_migrate=n,
        rejected=total_rows - int(stats["valid"]),
        before_cutoff=int(stats["before_cutoff"] or 0),
        other_endpoints=int(stats["valid"]) - int(stats["before_cutoff"] or 0) - n,
        already_due=already_due,
        due_soon=due_soon,
        earliest_due=_dt(lo) if lo is not None else None,
        latest_due=_dt(hi) if hi is not None else None,
        by_destination=tuple(
            DestinationCount(r["endpoint"], r["destination"], int(r["n"]), _dt(r["lo"]), _dt(r["hi"])) for r in groups
        ),
        rejects_by_reason=tuple((r["reason"], int(r["count"])) for r in rejects),
        histogram=histogram,
        bucket=bucket,
        chart=chart,
        warning=warning,
    )


def _bucket(lo: int | None, hi: int | None) -> tuple[str, int]:
    hour = 3_600 * 1_000_000
    span = (hi - lo) if lo is not None and hi is not None else 0
    if span <= 3 * 24 * hour:
        return "hour", hour
    if span <= 400 * 24 * hour:
        return "day", 24 * hour
    return "week", 7 * 24 * hour


# -- run -------------------------------------------------------------------------------------------


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


def _to_message(row: Any) -> DelayedMessage:
    return DelayedMessage(
        message_id=row["message_id"],
        destination=row["destination"],
        body=bytes(row["body"]),
        due_at=_dt(row["due_us"]),
        headers=Headers(json.loads(row["headers_json"])),
        failure_count=int(row["failure_count"]),
    )


def _write_partition(
    rows: Iterator[Any],
    spec: TargetSpec,
    run_folder: str,
    batch_size: int,
    now_us: int,
    skip: frozenset[int],
) -> None:
    """Write one Spark partition's batches (rows sorted by batch, then the target's key and message id)."""
    ledger = Ledger(run_folder)
    target: MigrationTarget | None = None
    try:
        for batch, group in groupby(rows, key=lambda r: int(r["batch"])):
            if batch in skip:
                continue
            if target is None:
                target = spec.build()
            _write_batch(target, ledger, Path(run_folder), batch, group, batch_size, now_us)
    finally:
        if target is not None:
            target.close()


def _write_batch(
    target: MigrationTarget,
    ledger: Ledger,
    run_folder: Path,
    batch: int,
    group: Iterable[Any],
    batch_size: int,
    now_us: int,
) -> None:
    """Write one batch; a checkpointing target resumes after the rows its last ``started`` record counted."""
    every = target.checkpoint_rows
    size = min(batch_size, every) if every else batch_size
    prior = ledger.entry(batch) if every else None
    resume = int(str(prior.get("sent_rows", 0))) if prior and prior.get("state") == BatchState.STARTED.value else 0
    written = int(str(prior.get("written", 0))) if resume and prior else 0
    due_now = int(str(prior.get("already_due", 0))) if resume and prior else 0
    refused = _read_refusals(run_folder, batch) if resume else []
    ledger.mark(batch, BatchState.STARTED, sent_rows=resume, written=written, already_due=due_now)
    chunk: dict[str, DelayedMessage] = {}  # by id: a repeated id keeps its latest-due row
    consumed = 0

    def flush() -> None:
        nonlocal written, chunk
        refused.extend(target.write(list(chunk.values())))
        written += len(chunk)
        chunk = {}
        if every:  # refusals first, so the ledger never counts rows whose refusals are not on disk
            _record_refusals(run_folder, batch, refused)
            ledger.mark(batch, BatchState.STARTED, sent_rows=consumed, written=written, already_due=due_now)

    for position, row in enumerate(group):
        if position < resume:
            continue
        mid = row["message_id"]
        if mid not in chunk and len(chunk) >= size:  # ids are sorted: a repeated id never straddles two sends
            flush()
        chunk[mid] = _to_message(row)
        due_now += row["due_us"] <= now_us
        consumed = position + 1
    if chunk:
        flush()
    target.flush()
    _record_refusals(run_folder, batch, refused)
    ledger.mark(batch, BatchState.COMPLETED, rows=written - len(refused), already_due=due_now, refused=len(refused))


def _read_refusals(run_folder: Path, batch: int) -> list[tuple[str, str]]:
    path = run_folder / "refused" / f"batch-{batch:05d}.jsonl"
    return _read_refusals_file(path) if path.exists() else []


def _record_refusals(run_folder: Path, batch: int, refused: Sequence[tuple[str, str]]) -> None:
    """Write (or clear) the batch's refusals: ``refused/batch-NNNNN.jsonl``, one ``{message_id, reason}`` a line."""
    path = run_folder / "refused" / f"batch-{batch:05d}.jsonl"
    if not refused:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"message_id": m, "reason": r}) + "\n" for m, r in refused))


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
    on_progress: Callable[[int, int], None] | None = None,
    legacy_table: LegacyTable | None = None,
) -> MigrationSummary:
    """Migrate (or with ``dry_run`` only count) the selected rows; resumable by ``run_id``.

    Besides the target writes, a run leaves ``migrated-ids/`` and ``legacy/`` (SQL that hides the migrated
    rows from ``legacy_table``, by default the shape's usual table: see ``legacy_sql``) in its folder.
    """
    from pyspark.sql import functions as F

    if not options.target:
        raise ConfigurationError("--target is required (e.g. sqlite:delays.db)")
    if batch_size < 1:
        raise ConfigurationError("--batch-size must be at least 1")
    spec = TargetSpec.parse(options.target)
    args = options.args()
    run_id = run_id or options.default_run_id()
    now = now or datetime.now(UTC)
    started = time.monotonic()
    folder = RunManifest.folder(output, run_id)
    if not dry_run:
        manifest = RunManifest.open(output, run_id, args)
    loaded = load_source(spark, options)
    try:
        todo = _with_batch(_filtered(loaded.valid, options), options.batches)
        rejected = loaded.rejects.count()
        if dry_run:
            counts = todo.agg(
                _count_all(),
                _sum_due(now),
            ).first()
            return MigrationSummary(
                run_id, spec.url, True, int(counts[0]), rejected, options.batches, 0, 0, 0,
                int(counts[1] or 0), time.monotonic() - started, 0, None, "dry-run",
            )  # fmt: skip
        rejects_path = str(folder / "rejects")
        loaded.rejects.write.mode("overwrite").json(rejects_path)
        ledger = Ledger(folder)
        done = frozenset(ledger.in_state(BatchState.COMPLETED))
        pending = sorted(set(range(options.batches)) - done)
        chosen = pending if max_batches is None else pending[:max_batches]
        to_write = todo.filter(todo["batch"].isin(chosen)) if chosen else todo.limit(0)
        per_batch = {int(r["batch"]): int(r["count"]) for r in to_write.groupBy("batch").count().collect()}
        for empty in set(chosen) - set(per_batch):
            ledger.mark(empty, BatchState.COMPLETED, rows=0, already_due=0)
        total = sum(per_batch.values())
        target = spec.build()
        try:
            target.prepare()
        finally:
            target.close()
        now_us = to_epoch_us(now)
        order = ["batch"]
        group_by = spec.sort_expression()
        if group_by is not None:  # e.g. the Azure shard, so consecutive rows fill one transaction
            to_write = to_write.withColumn("_group", F.expr(group_by))
            order.append("_group")
        # A total order inside each batch: a checkpointing target resumes a batch by row position.
        order += ["message_id", "due_us"]
        job = to_write.repartition(min(len(chosen), options.batches) or 1, "batch").sortWithinPartitions(*order)

        def work(rows: Iterator[Any]) -> None:
            _write_partition(rows, spec, str(folder), batch_size, now_us, done)

        _run_with_progress(lambda: job.foreachPartition(work), ledger, set(chosen), total, on_progress)
        entries = ledger.entries()
        written_now = [entries[b] for b in chosen if entries.get(b, {}).get("state") == BatchState.COMPLETED.value]
        complete = len(done) + len(written_now) == options.batches
        if complete:
            manifest = manifest.with_state(output, RunState.COMPLETED)
        seconds = time.monotonic() - started
        migrated = sorted(done | {b for b in chosen if entries.get(b, {}).get("state") == BatchState.COMPLETED.value})
        id_column = loaded.mapping.columns["id"]
        legacy = legacy_table or default_legacy_table(loaded.mapping.shape, id_column, options.source_endpoint)
        if legacy.id_column is None:
            legacy = LegacyTable(legacy.table, id_column, legacy.schema)
        ids_path, scripts = _write_migrated_ids(spark, todo, migrated, folder, run_id, legacy)
        summary = MigrationSummary(
            run_id=run_id,
            target=spec.url,
            dry_run=False,
            to_migrate=todo.count(),
            rejected=rejected,
            batches=options.batches,
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
        (folder / "summary.json").write_text(
            json.dumps({**_asdict(summary), "rows_per_second": summary.rows_per_second})
        )
        return summary
    finally:
        loaded.rows.unpersist()


def _write_migrated_ids(
    spark: Any, todo: Any, batches: Sequence[int], folder: Path, run_id: str, legacy: LegacyTable
) -> tuple[str, str]:
    """Write ``migrated-ids/`` (Parquet) and the legacy hide/restore scripts for the completed batches."""
    from pyspark.sql import functions as F

    refused = sorted({m for path in (folder / "refused").glob("batch-*.jsonl") for m, _ in _read_refusals_file(path)})
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


def _read_refusals_file(path: Path) -> list[tuple[str, str]]:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(str(i["message_id"]), str(i["reason"])) for i in items]


def _asdict(obj: Any) -> dict[str, object]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def _count_all() -> Any:
    from pyspark.sql import functions as F

    return F.count("*")


def _sum_due(now: datetime) -> Any:
    from pyspark.sql import functions as F

    return F.sum(F.when(F.col("due_us") <= F.lit(to_epoch_us(now)), 1).otherwise(0))


def _run_with_progress(
    action: Callable[[], None],
    ledger: Ledger,
    chosen: set[int],
    total: int,
    on_progress: Callable[[int, int], None] | None,
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
            entries = ledger.entries()
            rows = sum(
                int(str(e.get("rows", 0)))
                for b, e in entries.items()
                if b in chosen and e.get("state") == BatchState.COMPLETED.value
            )
            on_progress(rows, total)
    if failure:
        raise failure[0]
    if on_progress is not None:
        on_progress(total, total)


# -- abort -----------------------------------------------------------------------------------------


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
    built = spec.build()
    try:
        if not built.can_undo:
            note = getattr(built, "undo_note", f"the {spec.scheme} target cannot take back what was written")
            return AbortResult(run_id, spec.url, False, len(touched), 0, 0, note)
    finally:
        built.close()
    loaded = load_source(spark, options)
    try:
        rows = _with_batch(_filtered(loaded.valid, options), options.batches)
        expected = rows.filter(rows["batch"].isin(touched)).count() if touched else 0
        ids = rows.filter(rows["batch"].isin(touched)).select("message_id") if touched else None
        removed = 0
        if ids is not None:
            removed_acc = spark.sparkContext.accumulator(0)

            def undo(part: Iterator[Any]) -> None:
                tgt = spec.build()
                try:
                    chunk: list[str] = []
                    for r in part:
                        chunk.append(r["message_id"])
                        if len(chunk) >= 500:
                            removed_acc.add(tgt.undo(chunk))
                            chunk = []
                    if chunk:
                        removed_acc.add(tgt.undo(chunk))
                finally:
                    tgt.close()

            ids.foreachPartition(undo)
            removed = int(removed_acc.value)
    finally:
        loaded.rows.unpersist()
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


def main() -> None:
    """Entry point for spark-submit and ``python -m``: the ``migrate`` command group."""
    from delayed_delivery.app.cli.pipelines import run_migrate_app

    run_migrate_app()


if __name__ == "__main__":
    main()
