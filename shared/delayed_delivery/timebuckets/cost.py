"""The time-bucket tier's cost: the list prices, the work counted per message, and dollars line by line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ..durations import Delay, to_seconds
from ..errors import ConfigurationError, InvalidMessageError

__all__ = [
    "ASSUMED_BUCKET_COUNTS",
    "BILLED_CHUNK_BYTES",
    "DEFAULT_TRAFFIC_PER_MINUTE",
    "DYNAMODB_READ_PRICE",
    "LAMBDA_PRICE_PER_GB_SECOND",
    "LAMBDA_PRICE_PER_INVOCATION",
    "MEASURED_PATH_FIELDS",
    "PACKED_MEASURED_SIZE",
    "S3_GET_PRICE_PER_REQUEST",
    "S3_PUT_PRICE_PER_REQUEST",
    "S3_STORAGE_PRICE_PER_GB_MONTH",
    "SQS_MAX_BYTES",
    "STANDARD_PRICE_PER_REQUEST",
    "BucketCostEstimate",
    "BucketCounts",
    "BucketFixedCost",
    "BucketPath",
    "counts_at_traffic",
    "estimate_bucket_cost",
    "estimate_bucket_fixed_cost",
]

#: us-east-1 list prices (USD): SQS standard per request (per 64 KiB chunk), S3 PUT/COPY/POST/LIST and GET per
#: request, S3 Standard storage per GB-month, DynamoDB on-demand per read unit, Lambda per invocation and GB-second.
STANDARD_PRICE_PER_REQUEST = 0.0000004
S3_PUT_PRICE_PER_REQUEST = 0.000005
S3_GET_PRICE_PER_REQUEST = 0.0000004
S3_STORAGE_PRICE_PER_GB_MONTH = 0.023
DYNAMODB_READ_PRICE = 0.000000125
LAMBDA_PRICE_PER_INVOCATION = 0.0000002
LAMBDA_PRICE_PER_GB_SECOND = 0.0000166667
#: 64 KiB: every SQS request and Scheduler invocation is billed per chunk of payload.
BILLED_CHUNK_BYTES = 64 * 1024
SQS_MAX_BYTES = 1_048_576
#: Packing, parking and the tier were measured with 1 KiB messages.
PACKED_MEASURED_SIZE = 1024
#: The month S3 storage is billed by (30 days) and its gigabyte (2^30 bytes).
_MONTH_SECONDS = 30 * 86_400
_GB = 1024**3
#: SQS batches hold 10 messages.
_BATCH = 10
_DAY_RUNS = 1_440
#: The traffic (long-delayed messages a minute) the tier is priced at when none is given: the counts shipped as
#: ``measured.json``'s ``buckets`` were measured at it.
DEFAULT_TRAFFIC_PER_MINUTE = 1_000
#: Below this traffic an object holds one message whatever the rate: the per-object work stops growing per message.
_LOWEST_TRAFFIC = 1.0


@dataclass(frozen=True, slots=True)
class BucketPath:
    """The work per message on one path through the tier: written once (fine) or twice (coarse, then fine).

    ``ingest_requests``: billed standard SQS requests of the ingest (send, receive, delete); ``dispatch_requests``:
    the dispatch's ``SendMessageBatch``;
    ``s3_puts``: PUT-class requests (object writes, leases, LISTs beyond the fixed ones); ``s3_gets``: GET-class;
    ``dynamodb_reads``: read units of the cancellation look-ups; Lambda invocations and GB-seconds;
    ``stored_bytes``: the bytes S3 holds per 1 KiB message while it waits (0: its raw size, uncounted).
    """

    writes: int
    ingest_requests: float
    dispatch_requests: float
    s3_puts: float
    s3_gets: float
    dynamodb_reads: float = 0.0
    lambda_invocations: float = 0.0
    lambda_gb_seconds: float = 0.0
    stored_bytes: float = 0.0


#: The per-message fields of a ``BucketPath`` that the benchmark counts (every field but ``writes``).
MEASURED_PATH_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(BucketPath) if f.name != "writes")


@dataclass(frozen=True, slots=True)
class BucketCounts:
    """The tier's work per message (``near``: due within the coarse horizon; ``far``: later), and its fixed work.

    ``measured`` is False for the design's assumptions (1,000 messages per object, batches of 10); measured counts
    come from ``python -m benchmarks --only aws_costs`` (``source`` says which run, ``volume`` at what traffic).
    ``timer_lists_per_run`` and ``timer_gb_seconds_per_run`` are the timer's work with nothing to do (once a minute).
    """

    near: BucketPath = field(default_factory=lambda: BucketPath(1, 0.3, 0.1, 0.001, 0.001, 0.0, 0.002, 0.0006))
    far: BucketPath = field(default_factory=lambda: BucketPath(2, 0.3, 0.1, 0.002, 0.002, 0.0, 0.002, 0.0006))
    coarse_seconds: int = 86_400
    timer_lists_per_run: float = 2.0
    timer_gb_seconds_per_run: float = 0.05
    measured: bool = False
    source: str = "assumed from the design (docs/buckets.md), not yet measured"
    volume: str = ""

    def path(self, delay_seconds: float) -> BucketPath:
        """The path a delay takes: written once when due within a coarse bucket, else twice."""
        return self.near if delay_seconds <= self.coarse_seconds else self.far

    def as_dict(self) -> dict[str, Any]:
        """The package-data form (what ``from_dict`` reads)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BucketCounts:
        """Read the package-data form (``measured.json``'s ``buckets``)."""
        try:
            near, far = (BucketPath(**dict(data[k])) for k in ("near", "far"))
            return cls(
                near=near,
                far=far,
                coarse_seconds=int(data["coarse_seconds"]),
                timer_lists_per_run=float(data["timer_lists_per_run"]),
                timer_gb_seconds_per_run=float(data["timer_gb_seconds_per_run"]),
                measured=bool(data["measured"]),
                source=str(data["source"]),
                volume=str(data.get("volume", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"the measured bucket counts are malformed: {exc!r}") from None

    def updated(self, values: Mapping[str, float], source: str, volume: str) -> BucketCounts:
        """These counts with ``near.<name>`` / ``far.<name>`` / ``<name>`` replaced, marked measured by ``source``."""
        near_values: dict[str, Any] = {k[5:]: v for k, v in values.items() if k.startswith("near.")}
        far_values: dict[str, Any] = {k[4:]: v for k, v in values.items() if k.startswith("far.")}
        near, far = replace(self.near, **near_values), replace(self.far, **far_values)
        top: dict[str, Any] = {k: v for k, v in values.items() if "." not in k}
        return replace(self, near=near, far=far, **top, measured=True, source=source, volume=volume)


#: The counts ``estimate_bucket_cost`` uses unless given others.
ASSUMED_BUCKET_COUNTS = BucketCounts()


def counts_at_traffic(measured: Mapping[int, BucketCounts], per_minute: float) -> BucketCounts:
    """The tier's counts at ``per_minute`` messages a minute, from counts ``measured`` at some traffic levels.

    The per-object work (an object, its lease, its read, a timer step) is shared by the messages of one bucket from
    one ingest invocation, which grow with the traffic: a count per message is ``a + b / rate``. So each one is
    interpolated linearly in ``1 / rate`` between the two measured levels around ``per_minute``; below the lowest it
    is extrapolated from the two lowest (never below the lowest's figure; one message an object at most, from 1 a
    minute down); above the highest the highest's counts are used as they are (the saving stops being claimed).
    """
    if not measured:
        raise ConfigurationError("no measured traffic levels to price the tier at")
    if not per_minute > 0:
        raise InvalidMessageError(f"traffic must be a positive number of messages a minute, got {per_minute!r}")
    levels = sorted(measured)
    if per_minute in measured:
        return measured[int(per_minute)]
    if len(levels) == 1 or per_minute >= levels[-1]:
        top = measured[levels[-1]]
        return replace(top, volume=f"{per_minute:,g} a minute priced at the counts of {levels[-1]:,} a minute")
    rate = max(per_minute, _LOWEST_TRAFFIC)
    below = [level for level in levels if level <= rate]
    lo, hi = (below[-1], levels[levels.index(below[-1]) + 1]) if below else (levels[0], levels[1])
    t = (1 / rate - 1 / lo) / (1 / hi - 1 / lo)
    a, b = measured[lo], measured[hi]

    def path(x: BucketPath, y: BucketPath) -> BucketPath:
        values: dict[str, Any] = {}
        for name in MEASURED_PATH_FIELDS:
            low, high = getattr(x, name), getattr(y, name)
            value = low + (high - low) * t
            values[name] = max(value, low) if rate < lo else value
        return replace(x, **values)

    how = "interpolated between" if below else "extrapolated from"
    volume = f"{per_minute:,g} a minute: counts {how} {lo:,} and {hi:,} a minute (a + b / rate)"
    return replace(a, near=path(a.near, b.near), far=path(a.far, b.far), volume=volume)


@dataclass(frozen=True, slots=True)
class BucketCostEstimate:
    """Dollars for one message through the bucket tier, line by line; ``measured`` is the counts' ``measured``."""

    delay_seconds: float
    size_bytes: int
    writes_per_message: int
    sqs_requests: float
    s3_puts: float
    s3_gets: float
    ingest_usd: float
    s3_requests_usd: float
    dispatch_usd: float
    lambda_usd: float
    storage_usd: float
    measured: bool
    dynamodb_usd: float = 0.0

    @property
    def dollars(self) -> float:
        """The total per message."""
        return (
            self.ingest_usd
            + self.s3_requests_usd
            + self.dispatch_usd
            + self.lambda_usd
            + self.storage_usd
            + self.dynamodb_usd
        )


def estimate_bucket_cost(
    delay_seconds: Delay, size_bytes: int = PACKED_MEASURED_SIZE, counts: BucketCounts = ASSUMED_BUCKET_COUNTS
) -> BucketCostEstimate:
    """Cost of one message of ``size_bytes`` delayed ``delay_seconds`` in the time-bucket tier under ``counts``.

    The SQS requests were counted for 1 KiB messages; other sizes scale by billed chunks per message in batches
    of 10 (an approximation above 1 KiB). Storage is the bytes stored per message (counted for 1 KiB, scaled by
    size; the raw size when not counted) for the delay.
    """
    if not 1 <= size_bytes <= SQS_MAX_BYTES:
        raise InvalidMessageError(f"size must be from 1 to {SQS_MAX_BYTES:,} bytes (the SQS message limit)")
    seconds = to_seconds(delay_seconds)
    path = counts.path(seconds)
    scale = max(1.0, _chunks_per_message(size_bytes) / _chunks_per_message(PACKED_MEASURED_SIZE))
    ingest, dispatch = path.ingest_requests * scale, path.dispatch_requests * scale
    return BucketCostEstimate(
        delay_seconds=seconds,
        size_bytes=size_bytes,
        writes_per_message=path.writes,
        sqs_requests=ingest + dispatch,
        s3_puts=path.s3_puts,
        s3_gets=path.s3_gets,
        ingest_usd=ingest * STANDARD_PRICE_PER_REQUEST,
        s3_requests_usd=path.s3_puts * S3_PUT_PRICE_PER_REQUEST + path.s3_gets * S3_GET_PRICE_PER_REQUEST,
        dispatch_usd=dispatch * STANDARD_PRICE_PER_REQUEST,
        lambda_usd=path.lambda_invocations * LAMBDA_PRICE_PER_INVOCATION
        + path.lambda_gb_seconds * LAMBDA_PRICE_PER_GB_SECOND,
        storage_usd=_stored(path, size_bytes) / _GB * S3_STORAGE_PRICE_PER_GB_MONTH * seconds / _MONTH_SECONDS,
        measured=counts.measured,
        dynamodb_usd=path.dynamodb_reads * DYNAMODB_READ_PRICE,
    )


def _stored(path: BucketPath, size_bytes: int) -> float:
    """Bytes S3 holds for one message of ``size_bytes``: the counted figure scaled from 1 KiB, else the raw size."""
    return path.stored_bytes * size_bytes / PACKED_MEASURED_SIZE if path.stored_bytes > 0 else float(size_bytes)


def _chunks_per_message(size_bytes: int) -> float:
    """Billed chunks per message when 10 travel in one batch."""
    return -(-_BATCH * size_bytes // BILLED_CHUNK_BYTES) / _BATCH


@dataclass(frozen=True, slots=True)
class BucketFixedCost:
    """What the tier costs a month with no traffic: a timer run every minute (invocations, LISTs, GB-seconds)."""

    runs: int
    lists: float
    usd: float


def estimate_bucket_fixed_cost(counts: BucketCounts = ASSUMED_BUCKET_COUNTS, days: int = 30) -> BucketFixedCost:
    """The fixed monthly cost: 1,440 timer runs a day, each listing and running for ``counts``' figures."""
    runs = _DAY_RUNS * days
    lists = runs * counts.timer_lists_per_run
    usd = (
        runs * LAMBDA_PRICE_PER_INVOCATION
        + lists * S3_PUT_PRICE_PER_REQUEST
        + runs * counts.timer_gb_seconds_per_run * LAMBDA_PRICE_PER_GB_SECOND
    )
    return BucketFixedCost(runs, lists, usd)
