"""``delayed-delivery aws tier``: run the time-bucket tier's two functions locally against an endpoint.

The ingest function reads the ingest queue through a local stand-in for Lambda's SQS event source; the timer
function runs every ``--every`` seconds, as its EventBridge schedule does every minute. Settings (bucket sizes,
the ingest and error queues, the cancellation table) come from the ``DELAYED_DELIVERY_*`` environment.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from delayed_delivery.app.cli.aws_buckets import DEFAULT_BUCKET, BucketName, BucketPrefix
from delayed_delivery.app.cli.output import emit_json, err, fail, say, styled
from delayed_delivery.app.routes.aws_clients import cli_client
from delayed_delivery.app.routes.base import LOCAL_MOTO_URL
from delayed_delivery.aws.tier.config import BUCKET_NAME_ENV, BucketTierConfig
from delayed_delivery.errors import ConfigurationError, DelayedDeliveryError, DestinationNotFoundError

if TYPE_CHECKING:
    from delayed_delivery.aws.tier.ingest import IngestResult
    from delayed_delivery.aws.tier.timer import TimerResult
    from delayed_delivery.testing.aws import LocalEventSourcePoller

__all__ = ["TierTally", "run_tier_command"]


#: The summary's counts, in the order they are printed.
SUMMARY_FIELDS = ("ingested", "objects", "cascaded", "dispatched", "duplicates", "error_queue")


@dataclass(slots=True)
class TierTally:
    """What the two functions did while the command ran."""

    timer_runs: int = 0
    timer_failures: int = 0
    ingested: int = 0
    objects: int = 0
    cascaded: int = 0
    dispatched: int = 0
    duplicates: int = 0
    error_queue: int = 0
    cancelled: int = 0
    rescheduled: int = 0
    kept_for_retry: int = 0
    errors: list[str] = field(default_factory=list)

    def add_ingest(self, result: IngestResult) -> None:
        """Count one ingest invocation."""
        self.ingested += result.ingested
        self.objects += result.objects_written
        self.duplicates += result.duplicates
        self.error_queue += sum(1 for p in result.poison if p.sent)

    def add_timer(self, result: TimerResult) -> None:
        """Count one timer run."""
        self.cascaded += result.cascaded_messages
        self.dispatched += result.dispatched
        self.duplicates += result.duplicates_skipped
        self.error_queue += result.to_error_queue
        self.cancelled += result.cancelled
        self.rescheduled += result.rescheduled
        self.kept_for_retry += result.kept_for_retry

    def summary(self) -> dict[str, int]:
        """The counts (no error texts)."""
        return {k: v for k, v in asdict(self).items() if isinstance(v, int)}


class _Discard(io.StringIO):
    """A stdout that keeps nothing (the functions' Powertools output when not ``--verbose``)."""

    def write(self, text: str) -> int:
        return len(text)


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` (the loop ends after its current step); the old handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, lambda _signum, _frame: stop.set())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _config(bucket_name: str | None, prefix: str | None) -> BucketTierConfig:
    """The tier's configuration from the environment, the options over it (bucket as ``aws create`` names it)."""
    env = {**os.environ, BUCKET_NAME_ENV: (bucket_name or os.environ.get(BUCKET_NAME_ENV) or DEFAULT_BUCKET)}
    config = BucketTierConfig.from_env(env)
    if prefix and prefix.strip():
        config = replace(config, prefix=prefix.strip())
    return config


def _table_exists(dynamodb: Any, table: str) -> bool:
    """Whether ``table`` exists (a missing one, or an emulator without DynamoDB: False)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        dynamodb.describe_table(TableName=table)
    except (ClientError, BotoCoreError):
        return False
    return True


@dataclass(slots=True)
class _Tier:
    """The clients and the two handlers of one run."""

    config: BucketTierConfig
    poller: LocalEventSourcePoller
    timer: Any
    tally: TierTally


def _build(config: BucketTierConfig, endpoint: str, region: str | None, local: bool, tally: TierTally) -> _Tier:
    """Clients on the endpoint (S3 and DynamoDB may be split off by AWS_ENDPOINT_URL_S3 / _DYNAMODB), both handlers."""
    from botocore.exceptions import BotoCoreError, ClientError

    from delayed_delivery.aws.cancellations import DEFAULT_TABLE
    from delayed_delivery.aws.sqs import translate_error
    from delayed_delivery.aws.tier.ingest_handler import build_ingest_handler
    from delayed_delivery.aws.tier.store import S3BucketStore
    from delayed_delivery.aws.tier.timer_handler import build_timer_handler
    from delayed_delivery.testing.aws import LocalEventSourcePoller

    s3 = cli_client("s3", os.environ.get("AWS_ENDPOINT_URL_S3") or endpoint, region, local=local)
    sqs = cli_client("sqs", endpoint, region, local=local)
    dynamodb = cli_client("dynamodb", os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or endpoint, region, local=local)
    if config.cancellation_table is None and _table_exists(dynamodb, DEFAULT_TABLE):
        # `cancel --bucket-name` without DELAYED_DELIVERY_CANCELLATION_TABLE writes here: read the same table (#31)
        config = replace(config, cancellation_table=DEFAULT_TABLE)
    if config.cancellation_table is None:
        dynamodb = None
    S3BucketStore.from_config(s3, config).check()
    name = config.sqs_settings.bucket_ingest_queue
    try:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    except (ClientError, BotoCoreError) as exc:
        error = translate_error(exc, name)
        if not isinstance(error, DestinationNotFoundError):
            raise error from None
        raise ConfigurationError(
            f"the ingest queue {name!r} (DELAYED_DELIVERY_BUCKET_INGEST_QUEUE) does not exist: "
            "create the tier with `delayed-delivery aws create --buckets`"
        ) from None
    ingest = build_ingest_handler(config, s3=s3, sqs=sqs, on_result=tally.add_ingest)
    timer = build_timer_handler(config, s3=s3, sqs=sqs, dynamodb=dynamodb, on_result=tally.add_timer)

    def invoke(event: dict[str, Any], context: Any) -> dict[str, Any]:
        try:
            return ingest(event, context)
        except Exception as exc:  # the poller keeps the records for a retry, as Lambda would
            tally.errors.append(f"ingest: {type(exc).__name__}: {exc}")
            raise

    poller = LocalEventSourcePoller(sqs, url, arn, invoke, wait_seconds=1)
    return _Tier(config, poller, timer, tally)


def _run_timer(tier: _Tier, sink: IO[str]) -> None:
    """One timer invocation, as its schedule makes it; a failed run is counted, the next one starts over."""
    from delayed_delivery.testing.aws import LocalLambdaContext

    context = LocalLambdaContext(function_name="delayed-delivery-bucket-timer", timeout_s=60.0)
    tier.tally.timer_runs += 1
    try:
        with contextlib.redirect_stdout(sink):
            reply = tier.timer({"detail-type": "Scheduled Event", "source": "aws.events"}, context)
    except Exception as exc:  # a wrong deployment (bucket gone) fails the invocation; keep running, as Lambda
        reply = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"}
    if not reply.get("ok"):
        tier.tally.timer_failures += 1
        tier.tally.errors.append(f"timer: {reply.get('reason')}")


def _progress(tier: _Tier, elapsed: float) -> str:
    """One line per timer run."""
    t = tier.tally
    failed = f", {t.timer_failures} failed" if t.timer_failures else ""
    return (
        f"{elapsed:6.1f} s  run {t.timer_runs}{failed}: ingested {t.ingested} in {t.objects} object(s), "
        f"cascaded {t.cascaded}, dispatched {t.dispatched}, duplicates {t.duplicates}, error queue {t.error_queue}"
    )


def _serve(tier: _Tier, seconds: float, every: float, stop: threading.Event, sink: IO[str]) -> None:
    """Poll the ingest queue, and run the timer every ``every`` seconds (the first at once), until time or a signal."""
    from botocore.exceptions import BotoCoreError, ClientError

    from delayed_delivery.aws.sqs import translate_error

    start = time.monotonic()
    deadline, next_run = start + seconds, start
    while not stop.is_set() and (now := time.monotonic()) < deadline:
        if now >= next_run:
            _run_timer(tier, sink)
            next_run = max(next_run + every, time.monotonic())
            say(_progress(tier, now - start), stderr=True)  # when the run started
            continue
        wait = int(min(1.0, next_run - now, deadline - now))
        try:
            with contextlib.redirect_stdout(sink):
                received = tier.poller.poll_once(wait)
        except (ClientError, BotoCoreError) as exc:  # the endpoint failing is the command's error, one line
            raise translate_error(exc, tier.poller.queue_url) from None
        if not received and wait == 0:
            stop.wait(min(0.1, max(0.0, next_run - time.monotonic())))


def _fail(exc: BaseException) -> typer.Exit:
    return fail(str(exc))


def _report(tier: _Tier, stopped: bool, as_json: bool) -> None:
    """The summary; function errors (retried, as Lambda does) go to stderr."""
    t = tier.tally
    if t.errors:
        say(styled("warn", "yellow", f"{len(t.errors)} failed invocation(s), last: {t.errors[-1]}"), stderr=True)
    stats = {
        **t.summary(),
        "ingest_invocations": tier.poller.stats.invocations,
        "ingest_records_retried": tier.poller.stats.failed,
        "stopped_by_signal": stopped,
    }
    if as_json:
        emit_json(stats)
        return
    counts = ", ".join(f"{name.replace('_', ' ')} {stats[name]}" for name in SUMMARY_FIELDS)
    say(f"done: {t.timer_runs} timer run(s), {stats['ingest_invocations']} ingest invocation(s); {counts}")


def run_tier_command(
    seconds: Annotated[float, typer.Option("--for", help="Run this many seconds, then stop.")] = 60.0,
    every: Annotated[float, typer.Option("--every", help="Seconds between timer runs (the cloud: 60).")] = 60.0,
    local: Annotated[bool, typer.Option("--local", help="Use moto server at 127.0.0.1:5000 (`local up`).")] = False,
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", envvar="AWS_ENDPOINT_URL_SQS", help="Endpoint (e.g. moto server).")
    ] = None,
    region: Annotated[str | None, typer.Option("--region", envvar="AWS_DEFAULT_REGION", help="AWS region.")] = None,
    bucket_name: BucketName = None,
    bucket_prefix: BucketPrefix = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="The functions' logs and metrics to stderr.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final counts as JSON.")] = False,
) -> None:
    """Run the time-bucket tier's ingest and timer functions locally (made by `aws create --buckets`).

    The ingest function reads the ingest queue; the timer runs every --every seconds (first at once).

    Compressed bucket sizes come from DELAYED_DELIVERY_BUCKET_*_SECONDS, as for the functions in the cloud.

    SIGTERM or Ctrl-C stops it after the current step, with the summary.

    Example: delayed-delivery aws tier --local --every 1 --for 60
    """
    for option, value in (("--for", seconds), ("--every", every)):
        if not (math.isfinite(value) and value > 0):
            raise _fail(DelayedDeliveryError(f"{option} {value}: give a positive number of seconds"))
    endpoint = LOCAL_MOTO_URL if local else endpoint_url
    if not endpoint:
        raise _fail(DelayedDeliveryError("give --local (moto server on 127.0.0.1:5000) or --endpoint-url"))
    stop = threading.Event()
    sink: IO[str] = err.file if verbose else _Discard()
    try:
        config = _config(bucket_name, bucket_prefix)
        with contextlib.redirect_stdout(sink):  # Powertools writes logs and EMF metrics to stdout
            tier = _build(config, endpoint, region, local, TierTally())
        say(
            f"tier s3://{config.bucket_name}/{config.prefix}, ingest queue {config.sqs_settings.bucket_ingest_queue}, "
            f"timer every {every:g} s, for {seconds:g} s",
            stderr=True,
        )
        with _stop_on_signals(stop):
            _serve(tier, seconds, every, stop, sink)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    _report(tier, stop.is_set(), as_json)
