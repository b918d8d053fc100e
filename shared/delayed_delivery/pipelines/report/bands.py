"""Delay bands and percentiles of the report, and its end-to-end lateness tables from consumers' ``consumed`` lines.

A ``consumed`` line (``delayed_delivery.aws.receive`` / ``azure.receive`` ``observe_lateness``) carries
``consumer_lateness_s`` (received − due) and ``delay_s`` (due − sent, for the band). A message consumed twice counts
once, with the lateness of its first consumption. A recurring schedule's occurrence (its line names the
``occurrence``) has the band ``recurring``, whatever its delay: that is only how far ahead the timer wrote it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BANDS",
    "CONSUMER_TABLE_COLUMNS",
    "LATENESS_COLUMNS",
    "PERCENTILE_ACCURACY",
    "RECURRING",
    "band_expr",
    "band_order",
    "consumer_frames",
    "consumer_note",
    "pct",
]

#: Delay bands: (label, upper bound in seconds, inclusive).
BANDS: tuple[tuple[str, float], ...] = (
    ("≤15 min", 900),
    ("15 min–1 h", 3_600),
    ("1 h–1 d", 86_400),
    ("1 d–30 d", 30 * 86_400),
    ("over 30 d", float("inf")),
)
#: The band of a recurring schedule's occurrences (docs/pipelines.md), after the delay bands and before ``unknown``.
RECURRING = "recurring"
PERCENTILE_ACCURACY = 1_000_000

LATENESS_COLUMNS = (
    ("messages", "bigint"),
    ("p50_s", "double"),
    ("p95_s", "double"),
    ("p99_s", "double"),
    ("max_s", "double"),
)
#: The end-to-end (consumer) lateness tables' columns and Spark SQL types.
CONSUMER_TABLE_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "consumer_lateness_by_endpoint": (("endpoint", "string"), *LATENESS_COLUMNS),
    "consumer_lateness_by_band": (("band", "string"), *LATENESS_COLUMNS),
}


def band_expr(F: Any, col: Any, occurrence: Any = None) -> Any:
    """The band label of a delay column (``unknown`` when null); ``recurring`` where ``occurrence`` is not null."""
    expr = F.when(col.isNull(), F.lit("unknown"))
    if occurrence is not None:
        expr = F.when(occurrence.isNotNull(), F.lit(RECURRING)).when(col.isNull(), F.lit("unknown"))
    for label, upper in BANDS:
        expr = expr.when(col <= F.lit(upper), F.lit(label)) if upper != float("inf") else expr.otherwise(label)
    return expr


def band_order(F: Any) -> Any:
    """Sort key of the ``band`` column: shortest band first, then ``recurring``, ``unknown`` last."""
    labels = [*(b for b, _ in BANDS), RECURRING, "unknown"]
    return F.array_position(F.array(*[F.lit(b) for b in labels]), F.col("band"))


def pct(F: Any, column: str) -> list[Any]:
    """p50, p95, p99 (nearest-rank) and max of ``column``."""
    p = F.percentile_approx(column, [0.5, 0.95, 0.99], PERCENTILE_ACCURACY)
    return [p[0].alias("p50_s"), p[1].alias("p95_s"), p[2].alias("p99_s"), F.max(column).alias("max_s")]


def consumer_frames(F: Any, consumed: Any, known_delays: Any = None) -> dict[str, Any]:
    """The consumer lateness tables from the ``consumed`` events (``ts`` parsed), one row per message first.

    ``known_delays`` (``message_id``, ``known_delay``): the delay the other lines give a message, for the band when
    its ``consumed`` line has none (a table-routed message's consumer does not know when it was sent).
    """
    per_msg = (
        consumed.filter(F.col("consumer_lateness_s").isNotNull())
        .groupBy("message_id")
        .agg(
            F.coalesce(F.first("endpoint", ignorenulls=True), F.first("destination", ignorenulls=True)).alias(
                "endpoint"
            ),
            F.min_by("consumer_lateness_s", F.col("ts")).alias("lateness_s"),
            F.min_by("delay_s", F.col("ts")).alias("delay_s"),
            F.first("occurrence", ignorenulls=True).alias("occurrence"),
        )
    )
    if known_delays is not None:
        per_msg = (
            per_msg.join(known_delays, "message_id", "left")
            .withColumn("delay_s", F.coalesce(F.col("delay_s"), F.col("known_delay")))
            .drop("known_delay")
        )
    per_msg = per_msg.withColumn("band", band_expr(F, F.col("delay_s"), F.col("occurrence")))
    by = {
        "consumer_lateness_by_endpoint": ("endpoint", F.col("endpoint")),
        "consumer_lateness_by_band": ("band", band_order(F)),
    }
    return {
        name: per_msg.groupBy(key).agg(F.count("*").alias("messages"), *pct(F, "lateness_s")).orderBy(order)
        for name, (key, order) in by.items()
    }


def consumer_note(tables: dict[str, list[dict[str, Any]]]) -> str | None:
    """Why the consumer tables are empty, or ``None``."""
    if tables["consumer_lateness_by_endpoint"]:
        return None
    return (
        "No `consumed` line with `consumer_lateness_s`, so the end-to-end lateness tables are empty: consumers log "
        "it with `observe_lateness` (docs/receiving.md)."
    )
