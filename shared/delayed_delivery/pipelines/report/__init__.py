"""Spark job: what happened to delayed messages, from the dispatchers' JSON-lines logs.

Run with ``python -m delayed_delivery.pipelines report --logs … --output …``,
``spark-submit …/delayed_delivery/pipelines/__main__.py report …`` or ``delayed-delivery report …``.

Input fields (one JSON object per line, as ``logjson.JsonFormatter`` and the Lambda's Powertools logger
write and CloudWatch Logs or Application Insights export; unknown fields are ignored, missing ones null):

* ``timestamp``: ISO-8601, Powertools' ``yyyy-MM-dd HH:mm:ss,fff+0000``, or epoch seconds/milliseconds;
* ``event``: ``stored``, ``dispatched``, ``already_removed``, ``dispatch_failed``, ``moved_to_error_queue``,
  ``requeued`` or ``forwarded``;
* ``message_id``, ``destination``, ``endpoint`` (optional; the destination stands in), ``due_at`` (ISO-8601),
  ``lateness_s``, ``hop``, ``remaining_delay_s``, ``reason``, ``cloud`` (``aws``/``azure``/``local``),
  and optionally ``delay_s`` and ``requests``; consumers' ``consumed`` lines add ``consumer_lateness_s`` and, for a
  recurring schedule's occurrence, ``occurrence`` (its nominal instant).

Definitions: the messages are those of the dispatch-side lines (every event but ``consumed``); a message's delay
is ``delay_s`` if its lines log it, else ``due_at`` minus the time of its ``stored`` event, else the ``delay_s`` of
its ``consumed`` line (the consumer knows its due and send times); its cloud is the first ``cloud`` its lines name,
else its ``consumed`` line's; a message whose ``consumed`` line names an ``occurrence`` has the band ``recurring``
whatever its delay (the timer's lead);
its lateness is the ``lateness_s`` of its first ``dispatched`` event; a duplicate delivery is every
``dispatched``/``already_removed`` event after the first; its hops are its ``requeued``/``forwarded``
events (SQS FIFO cycles); its SQS requests are the logged ``requests`` sum, else 2 per hop (send and
delete; receives are batched) plus 1 final send. Throughput counts hand-overs to the destination per minute:
``dispatched`` (store dispatchers) and ``forwarded`` (the SQS requeue function). Percentiles are nearest-rank:
the smallest value with at least p of the values at or below it. ``consumed`` lines give a message's delay and
cloud, and the end-to-end lateness tables (``bands.consumer_frames``); dispatch-side lateness stays the
dispatchers' own.

Besides the tables (Parquet and CSV) and the charts (PNG), ``summary.md`` and ``summary.html`` (one page, the
charts inside) are written. ``check_paths`` refuses a missing log path or an output that is a file before Spark
starts.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delayed_delivery.cost import FIFO_PRICE_PER_REQUEST
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.pipelines.report.bands import (
    BANDS,
    CONSUMER_TABLE_COLUMNS,
    LATENESS_COLUMNS,
    PERCENTILE_ACCURACY,
    band_expr,
    band_order,
    consumer_frames,
    consumer_note,
    pct,
)
from delayed_delivery.pipelines.report.summary import markdown, page
from delayed_delivery.timebuckets.cost import STANDARD_PRICE_PER_REQUEST

__all__ = ["BANDS", "TABLE_COLUMNS", "ReportResult", "build_report", "check_paths", "main"]

#: Every table's columns and Spark SQL types: its CSV header and Parquet schema, also when it has no rows.
TABLE_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "lateness_by_endpoint": (("endpoint", "string"), *LATENESS_COLUMNS),
    "lateness_by_band": (("band", "string"), *LATENESS_COLUMNS),
    "duplicates": (
        ("endpoint", "string"),
        ("delivered_messages", "bigint"),
        ("messages_with_duplicates", "bigint"),
        ("duplicate_deliveries", "bigint"),
    ),
    "hops": (("hops", "bigint"), ("messages", "bigint")),
    "hops_by_band": (
        ("band", "string"),
        ("messages", "bigint"),
        ("mean_hops", "double"),
        ("p50_hops", "bigint"),
        ("max_hops", "bigint"),
    ),
    "error_queue": (("endpoint", "string"), ("reason", "string"), ("forwards", "bigint")),
    "throughput": (("minute", "timestamp"), ("dispatched", "bigint")),
    "cost_by_band": (
        ("band", "string"),
        ("messages", "bigint"),
        ("mean_delay_s", "double"),
        ("mean_hops", "double"),
        ("measured_requests_per_message", "double"),
        ("measured_usd_per_message", "double"),
        ("nservicebus_formula_requests_per_message", "double"),
        ("nservicebus_formula_usd_per_message", "double"),
    ),
    **CONSUMER_TABLE_COLUMNS,
}


def _log_schema() -> Any:
    from pyspark.sql import types as T

    s, d = T.StringType(), T.DoubleType()
    return T.StructType(
        [
            T.StructField(name, kind)
            for name, kind in (
                ("timestamp", s),
                ("event", s),
                ("message_id", s),
                ("destination", s),
                ("endpoint", s),
                ("due_at", s),
                ("lateness_s", d),
                ("hop", T.LongType()),
                ("remaining_delay_s", d),
                ("reason", s),
                ("cloud", s),
                ("delay_s", d),
                ("requests", d),
                ("consumer_lateness_s", d),
                ("occurrence", s),
            )
        ]
    )


@dataclass(frozen=True, slots=True)
class ReportResult:
    """Where the report was written, its headline numbers and every table's rows."""

    output: str
    lines: int
    events: int
    messages: int
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    charts: tuple[str, ...] = ()
    summary_markdown: str = ""
    #: Why tables are empty (no log lines, no lateness logged, no SQS messages), in the words of the summary.
    notes: tuple[str, ...] = ()


def _timestamp(F: Any, column: str) -> Any:
    """ISO-8601, Powertools' ``2026-01-01 10:00:00,123+0000``, or epoch seconds / milliseconds, as a timestamp."""
    text = F.trim(F.col(column))
    iso = F.regexp_replace(F.regexp_replace(text, ",", "."), r"([+-]\d\d)(\d\d)$", "$1:$2")
    return F.coalesce(
        iso.try_cast("timestamp"),
        F.when(text.rlike(r"^\d{12,13}$"), F.timestamp_millis(text.cast("long"))),
        F.when(text.rlike(r"^\d{9,10}(\.\d+)?$"), F.timestamp_seconds(text.cast("double"))),
    )


def _local(path: str) -> bool:
    """Whether ``path`` is on this machine (not ``s3://``, ``hdfs://``, ``abfss://`` … that Spark reads itself)."""
    return "://" not in path or path.startswith("file://")


def check_paths(logs: str, output: str) -> None:
    """Refuse a log path that does not exist or an output that is a file, in one line, before Spark starts."""
    if _local(logs) and not Path(logs.removeprefix("file://")).exists():
        raise ConfigurationError(f"log path {logs!r} does not exist (give --logs a JSON-lines file or a folder)")
    if _local(output) and Path(output.removeprefix("file://")).is_file():
        raise ConfigurationError(f"output {output!r} is a file: give --output a folder (it is created if missing)")


def build_report(spark: Any, logs: str, output: str) -> ReportResult:
    """Read the logs, compute every table, write Parquet + CSV + PNG charts + summary.md under ``output``.

    Every table has a fixed schema, so empty logs, one cloud's logs or logs without lateness give empty
    tables (and a summary that says why), never a failed job.
    """
    from pyspark.sql import functions as F

    check_paths(logs, output)
    raw = spark.read.schema(_log_schema()).option("mode", "PERMISSIVE").json(logs)
    lines = raw.count()
    events_all = (
        raw.filter(F.col("event").isNotNull() & F.col("message_id").isNotNull())
        .withColumn("ts", _timestamp(F, "timestamp"))
        .withColumn("due", _timestamp(F, "due_at"))
        .persist()
    )
    ev = events_all.filter(F.col("event") != "consumed")  # consumers' lines: no dispatch-side event
    per_msg = _per_message(F, ev, events_all.filter(F.col("event") == "consumed")).persist()
    try:
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        per_msg.write.mode("overwrite").parquet(str(out / "messages.parquet"))
        tables = _tables(F, ev, per_msg, events_all.filter(F.col("event") == "consumed"))
        for name, rows in tables.items():
            _write_table(spark, out, name, rows)
        charts = _charts(out, tables)
        events, messages = events_all.count(), per_msg.count()
        clouds = sorted(r[0] for r in events_all.select("cloud").distinct().collect() if r[0])
        unbanded = per_msg.filter(F.col("band") == "unknown").count()
        notes = _notes(logs, tables, lines, events, clouds, unbanded)
        summary = markdown(tables, (lines, events, messages), notes, charts)
        (out / "summary.md").write_text(summary, encoding="utf-8")
        (out / "summary.html").write_text(page(tables, (lines, events, messages), notes, charts), encoding="utf-8")
        return ReportResult(str(out), lines, events, messages, tables, charts, summary, notes)
    finally:
        events_all.unpersist()
        per_msg.unpersist()


def _per_message(F: Any, ev: Any, consumed: Any) -> Any:
    """One row per message of the dispatch-side lines: its endpoint, cloud, delay and band, lateness, deliveries,
    hops and SQS requests; a delay or cloud its own lines do not log comes from its ``consumed`` lines."""

    def is_(*names: str) -> Any:
        return F.col("event").isin(list(names))

    first = F.first
    facts = consumed.groupBy("message_id").agg(
        F.max("delay_s").alias("consumed_delay"),
        first("cloud", ignorenulls=True).alias("consumed_cloud"),
        first("occurrence", ignorenulls=True).alias("occurrence"),
    )
    return (
        ev.groupBy("message_id")
        .agg(
            first("destination", ignorenulls=True).alias("destination"),
            F.coalesce(first("endpoint", ignorenulls=True), first("destination", ignorenulls=True)).alias("endpoint"),
            first("cloud", ignorenulls=True).alias("cloud"),
            F.max("delay_s").alias("logged_delay"),
            F.min(F.when(is_("stored"), F.col("ts"))).alias("stored_at"),
            F.max("due").alias("due"),
            F.min_by("lateness_s", F.when(is_("dispatched"), F.col("ts"))).alias("lateness_s"),
            F.sum(F.when(is_("dispatched", "already_removed"), 1).otherwise(0)).alias("deliveries"),
            F.sum(F.when(is_("requeued", "forwarded"), 1).otherwise(0)).alias("hop_events"),
            F.max("hop").alias("max_hop"),
            F.sum(F.when(is_("moved_to_error_queue"), 1).otherwise(0)).alias("error_queue"),
            F.sum("requests").alias("logged_requests"),
        )
        .join(facts, "message_id", "left")
        .withColumn("cloud", F.coalesce(F.col("cloud"), F.col("consumed_cloud")))
        .withColumn(
            "delay_s",
            F.coalesce(
                F.col("logged_delay"),
                F.expr("unix_micros(due) - unix_micros(stored_at)").cast("double") / 1e6,
                F.col("consumed_delay"),
            ),
        )
        .withColumn("hops", F.greatest(F.col("hop_events"), F.coalesce(F.col("max_hop"), F.lit(0))).cast("long"))
        .withColumn("band", band_expr(F, F.col("delay_s"), F.col("occurrence")))
        .withColumn("duplicates", F.greatest(F.col("deliveries") - 1, F.lit(0)))
        .withColumn(
            "requests",
            F.when(F.col("logged_requests").isNotNull(), F.col("logged_requests")).when(
                F.col("cloud") == "aws", (F.col("hops") * 2 + 1).cast("double")
            ),
        )
        .drop(
            "logged_delay", "hop_events", "max_hop", "logged_requests", "consumed_delay", "consumed_cloud", "occurrence"
        )
    )


def _ddl(name: str) -> str:
    return ", ".join(f"`{column}` {kind}" for column, kind in TABLE_COLUMNS[name])


def _rows(F: Any, name: str, df: Any) -> list[dict[str, Any]]:
    """The table's rows, with exactly its declared columns and types."""
    typed = df.select(*[F.col(column).cast(kind).alias(column) for column, kind in TABLE_COLUMNS[name]])
    return [r.asDict() for r in typed.collect()]


def _tables(F: Any, ev: Any, per_msg: Any, consumed: Any) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows, in ``TABLE_COLUMNS`` order."""
    frames = {
        **_lateness_frames(F, per_msg),
        **_delivery_frames(F, ev, per_msg),
        **_cost_frames(F, per_msg),
        **consumer_frames(F, consumed, per_msg.select("message_id", F.col("delay_s").alias("known_delay"))),
    }
    return {name: _rows(F, name, frames[name]) for name in TABLE_COLUMNS}


def _lateness_frames(F: Any, per_msg: Any) -> dict[str, Any]:
    delivered = per_msg.filter(F.col("lateness_s").isNotNull())
    by = {"lateness_by_endpoint": ("endpoint", F.col("endpoint")), "lateness_by_band": ("band", band_order(F))}
    return {
        name: delivered.groupBy(key).agg(F.count("*").alias("messages"), *pct(F, "lateness_s")).orderBy(order)
        for name, (key, order) in by.items()
    }


def _delivery_frames(F: Any, ev: Any, per_msg: Any) -> dict[str, Any]:
    return {
        "duplicates": per_msg.groupBy("endpoint")
        .agg(
            F.sum(F.when(F.col("deliveries") > 0, 1).otherwise(0)).alias("delivered_messages"),
            F.sum(F.when(F.col("duplicates") > 0, 1).otherwise(0)).alias("messages_with_duplicates"),
            F.sum("duplicates").alias("duplicate_deliveries"),
        )
        .orderBy("endpoint"),
        "hops": per_msg.groupBy("hops").agg(F.count("*").alias("messages")).orderBy("hops"),
        "hops_by_band": per_msg.groupBy("band")
        .agg(
            F.count("*").alias("messages"),
            F.avg("hops").alias("mean_hops"),
            F.percentile_approx("hops", 0.5, PERCENTILE_ACCURACY).alias("p50_hops"),
            F.max("hops").alias("max_hops"),
        )
        .orderBy(band_order(F)),
        "error_queue": ev.filter(F.col("event") == "moved_to_error_queue")
        .withColumn("endpoint", F.coalesce(F.col("endpoint"), F.col("destination")))
        .groupBy("endpoint", F.coalesce(F.col("reason"), F.lit("(no reason logged)")).alias("reason"))
        .agg(F.count("*").alias("forwards"))
        .orderBy(F.desc("forwards"), "endpoint", "reason"),
        "throughput": ev.filter(F.col("event").isin("dispatched", "forwarded"))
        .groupBy(F.date_trunc("minute", F.col("ts")).alias("minute"))
        .agg(F.count("*").alias("dispatched"))
        .orderBy("minute"),
    }


def _cost_frames(F: Any, per_msg: Any) -> dict[str, Any]:
    """SQS messages only: measured requests and USD against the NServiceBus formula (delay / 900 × 2 requests)."""
    aws = per_msg.filter(F.col("requests").isNotNull())
    measured_usd = (F.col("requests") - 1) * F.lit(FIFO_PRICE_PER_REQUEST) + F.lit(STANDARD_PRICE_PER_REQUEST)
    formula_requests = F.col("delay_s") / F.lit(900.0) * F.lit(2.0)
    cost = (
        aws.groupBy("band")
        .agg(
            F.count("*").alias("messages"),
            F.avg("delay_s").alias("mean_delay_s"),
            F.avg("hops").alias("mean_hops"),
            F.avg("requests").alias("measured_requests_per_message"),
            F.avg(measured_usd).alias("measured_usd_per_message"),
            F.avg(formula_requests).alias("nservicebus_formula_requests_per_message"),
            F.avg(formula_requests * F.lit(FIFO_PRICE_PER_REQUEST)).alias("nservicebus_formula_usd_per_message"),
        )
        .orderBy(band_order(F))
    )
    return {"cost_by_band": cost}


def _write_table(spark: Any, out: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """One table as Parquet (via Spark, with its schema even when empty) and CSV (small, written on the driver)."""
    columns = [column for column, _ in TABLE_COLUMNS[name]]
    with (out / f"{name}.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([row[c] for c in columns])
    frame = spark.createDataFrame([tuple(row[c] for c in columns) for row in rows], _ddl(name))
    frame.coalesce(1).write.mode("overwrite").parquet(str(out / f"{name}.parquet"))


def _charts(out: Path, tables: dict[str, list[dict[str, Any]]]) -> tuple[str, ...]:
    from delayed_delivery.pipelines.charts import count_bar_chart, grouped_bar_chart, minute_bar_chart

    charts: list[str] = []
    lat = tables["lateness_by_band"]
    if lat:
        charts.append(
            grouped_bar_chart(
                str(out / "lateness_by_band.png"),
                [r["band"] for r in lat],
                {k: [float(r[k] or 0) for r in lat] for k in ("p50_s", "p95_s", "p99_s", "max_s")},
                title="Lateness by delay band",
                ylabel="seconds late",
            )
        )
    thr = tables["throughput"]
    if thr:
        charts.append(
            minute_bar_chart(
                str(out / "throughput.png"),
                [r["minute"] for r in thr],
                [int(r["dispatched"]) for r in thr],
                title="Handed to the destination, per minute",
                ylabel="messages in the minute",
            )
        )
    hops = tables["hops"]
    if hops:
        charts.append(
            count_bar_chart(
                str(out / "hops.png"),
                [int(r["hops"]) for r in hops],
                [int(r["messages"]) for r in hops],
                title="Hops per message (SQS FIFO cycles)",
                xlabel="hops",
                ylabel="messages",
            )
        )
    cost = tables["cost_by_band"]
    if cost:
        charts.append(
            grouped_bar_chart(
                str(out / "cost_by_band.png"),
                [r["band"] for r in cost],
                {
                    "measured": [float(r["measured_usd_per_message"] or 0) for r in cost],
                    "NServiceBus formula": [float(r["nservicebus_formula_usd_per_message"] or 0) for r in cost],
                },
                title="SQS cost per message by delay band",
                ylabel="USD per message (log scale)",
                log=True,
            )
        )
    return tuple(charts)


def _notes(
    logs: str,
    tables: dict[str, list[dict[str, Any]]],
    lines: int,
    events: int,
    clouds: Sequence[str],
    unbanded: int = 0,
) -> tuple[str, ...]:
    """Why tables are empty, in plain words (empty for a report where every table has rows)."""
    if not lines:
        return (f"No log lines in {logs}: every table is empty.",)
    if not events:
        return (
            f"None of the {lines:,} log lines is a delayed-delivery event (a JSON object with `event` and "
            "`message_id`): every table is empty.",
        )
    notes = [f"Clouds named in these logs: {', '.join(clouds)}." if clouds else "No log line names its `cloud`."]
    if unbanded:
        notes.append(
            f"{unbanded:,} message(s) have no delay in these logs (no line with `delay_s`, and no `stored` line with "
            "`due_at`), so their band is `unknown`: the consumers' `consumed` lines and the senders' `stored` lines "
            "carry it."
        )
    if not tables["lateness_by_endpoint"]:
        notes.append(
            "No message has a logged lateness (a `dispatched` event with `lateness_s`), so the lateness tables are "
            "empty: the SQS requeue function logs `forwarded` when it hands a message to its destination queue; "
            "the store dispatchers (Azure, PostgreSQL, SQLite) log `dispatched` with its lateness."
        )
    if not tables["throughput"]:
        notes.append("No `dispatched` or `forwarded` events, so there is no throughput to chart.")
    if not tables["cost_by_band"]:
        notes.append("No SQS messages (`cloud` `aws`, or logged `requests`), so the cost table is empty.")
    consumer = consumer_note(tables)
    if consumer:
        notes.append(consumer)
    return tuple(notes)
