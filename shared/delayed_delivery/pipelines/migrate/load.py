"""Reading a legacy export and mapping every row to the native model; rows that cannot be mapped are rejects."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.jsonbounds import parse_headers_json
from delayed_delivery.model import DelayedMessage, Headers
from delayed_delivery.pipelines.bucket_target import BUCKET_SCHEME, bucket_batches
from delayed_delivery.pipelines.migrate.options import MigrationOptions
from delayed_delivery.pipelines.schema import ColumnMapping, Reject, detect_shape, normalize_row, to_epoch_us
from delayed_delivery.pipelines.targets import TargetSpec

__all__ = ["LoadedSource", "filtered", "from_epoch_us", "load_source", "to_message", "with_batch"]

_TIMESTAMP_TEXT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"


def _row_schema() -> Any:
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


def _reject(reason: str, raw: str) -> tuple[Any, ...]:
    return (False, None, None, None, None, None, None, None, reason, raw)


def _raw_json(row: dict[str, object]) -> str:
    def plain(v: object) -> object:
        if isinstance(v, bytes | bytearray):
            return "base64:" + base64.b64encode(bytes(v)).decode()
        return v if isinstance(v, str | int | float | bool | type(None)) else str(v)

    return json.dumps({k: plain(v) for k, v in row.items()}, ensure_ascii=False, sort_keys=True)


def _json_object(line: str) -> dict[str, object] | tuple[Any, ...]:
    """The object on one JSON line, or the reject row that says why there is none."""
    try:
        data = json.loads(line)
    except ValueError:
        return _reject("malformed JSON line", line)
    if not isinstance(data, dict):
        return _reject("JSON line is not an object", line)
    return data


def _normalize_partition(rows: Iterable[Any], mapping: ColumnMapping, json_text: bool) -> Iterator[tuple[Any, ...]]:
    for row in rows:
        if json_text:
            line = row[0]
            if not line or not line.strip():
                continue
            parsed = _json_object(line)
            if isinstance(parsed, tuple):
                yield parsed
                continue
            data = parsed
        else:
            data = row.asDict()
        result = normalize_row(data, mapping)
        if isinstance(result, Reject):
            yield _reject(result.reason, _raw_json(data))
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


def _read(spark: Any, source: str, fmt: str) -> tuple[Any, list[str]]:
    """The export as Spark reads it, and its column names (for JSON lines: the keys of the first 200 lines)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if fmt == "parquet":
        df = spark.read.parquet(source)
        for f in df.schema.fields:
            if isinstance(f.dataType, T.TimestampType | T.TimestampNTZType):
                df = df.withColumn(f.name, F.date_format(F.col(f.name), _TIMESTAMP_TEXT))
        return df, list(df.columns)
    if fmt == "csv":
        reader = spark.read.option("header", True).option("escape", '"').option("mode", "PERMISSIVE")
        df = reader.option("inferSchema", False).csv(source)
        return df, list(df.columns)
    df = spark.read.text(source)
    return df, _json_columns(df.limit(200).collect())


def load_source(spark: Any, options: MigrationOptions) -> LoadedSource:
    """Read the export and map it to the native model; malformed rows become rejects."""
    fmt = options.format()
    if not Path(options.source).exists():
        raise ConfigurationError(f"source {options.source!r} does not exist")
    df, columns = _read(spark, options.source, fmt)
    shape = options.shape or detect_shape(columns)
    mapping = ColumnMapping.for_columns(shape, columns, options.body_encoding, options.source_endpoint)
    json_text = fmt == "json"
    rdd = df.rdd.mapPartitions(lambda rows: _normalize_partition(rows, mapping, json_text))
    mapped = spark.createDataFrame(rdd, _row_schema()).persist()
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


def filtered(valid: Any, options: MigrationOptions) -> Any:
    """The valid rows the options select: due after ``cutoff``, of the chosen ``endpoints``."""
    from pyspark.sql import functions as F

    if options.cutoff is not None:
        valid = valid.filter(F.col("due_us") > F.lit(to_epoch_us(options.cutoff)))
    if options.endpoints:
        valid = valid.filter(F.col("endpoint").isin(list(options.endpoints)))
    return valid


def with_batch(valid: Any, batches: int, spec: TargetSpec | None = None) -> Any:
    """Add the ``batch`` column: a hash of the message id modulo the number of batches (the bucket tier: its day)."""
    from pyspark.sql import functions as F

    if spec is not None and spec.scheme == BUCKET_SCHEME:
        return bucket_batches(valid, batches, spec)
    return valid.withColumn("batch", F.pmod(F.xxhash64("message_id"), F.lit(batches)).cast("int"))


def from_epoch_us(us: int) -> datetime:
    """A UTC time from microseconds since the epoch."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(us))


def to_message(row: Any) -> DelayedMessage:
    """A valid mapped row as the message the targets write."""
    return DelayedMessage(
        message_id=row["message_id"],
        destination=row["destination"],
        body=bytes(row["body"]),
        due_at=from_epoch_us(row["due_us"]),
        headers=Headers(parse_headers_json(row["headers_json"])),
        failure_count=int(row["failure_count"]),
    )
