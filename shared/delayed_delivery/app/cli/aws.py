"""``delayed-delivery aws …``: check an endpoint's queues, create them, send a delayed message, run the requeue.

Every command takes ``--endpoint-url`` (or ``AWS_ENDPOINT_URL_SQS``, e.g. a local moto server) and
``--region``; settings such as ``DELAYED_DELIVERY_FIFO_QUEUE_DELAY`` come from the environment (``AwsConfig``).
"""

from __future__ import annotations

import io
import math
import os
import time
from collections import Counter
from contextlib import redirect_stdout
from dataclasses import replace
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from delayed_delivery.app.cli.aws_buckets import (
    BucketName,
    BucketPrefix,
    BucketsFlag,
    check_tier,
    create_tier,
    has_tier,
    tier_config,
)
from delayed_delivery.app.cli.aws_tier import run_tier_command
from delayed_delivery.app.cli.output import emit_json, err, fail, say, styled
from delayed_delivery.app.cli.verify_aws import run_verify_command
from delayed_delivery.app.routes.aws_clients import cli_client, cli_region
from delayed_delivery.app.routes.base import LOCAL_MOTO_URL
from delayed_delivery.aws.cancellations import DEFAULT_TABLE, TABLE_ENV, ensure_cancellation_table
from delayed_delivery.aws.config import AwsConfig
from delayed_delivery.aws.queues import (
    DELAY_QUEUE_VISIBILITY_SECONDS,
    check_endpoint,
    ensure_endpoint,
    record_endpoint,
)
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.errors import DelayedDeliveryError
from delayed_delivery.naming import sqs_delay_queue_name

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from delayed_delivery.aws.requeue import RecordResult
    from delayed_delivery.testing.aws import LocalEventSourcePoller

__all__ = ["aws_app"]

aws_app = typer.Typer(
    name="aws",
    help="SQS unrestricted delayed delivery: check, create, send, and run the requeue function locally.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EndpointUrl = Annotated[
    str | None, typer.Option("--endpoint-url", envvar="AWS_ENDPOINT_URL_SQS", help="SQS endpoint (e.g. moto server).")
]
Region = Annotated[str | None, typer.Option("--region", envvar="AWS_DEFAULT_REGION", help="AWS region.")]
Queue = Annotated[str, typer.Option("--queue", "-q", help="The endpoint's input queue (or its -delay.fifo).")]


Local = Annotated[
    bool,
    typer.Option("--local", help="Use moto server at 127.0.0.1:5000, as `delayed-delivery local up` starts it."),
]


def _endpoint(local: bool, endpoint_url: str | None) -> str | None:
    """Moto server as ``local up`` starts it with ``--local``, else ``--endpoint-url`` (None: the SDK's own)."""
    return LOCAL_MOTO_URL if local else endpoint_url


def _client(endpoint_url: str | None, region: str | None, local: bool = False) -> SQSClient:
    client: SQSClient = cli_client("sqs", endpoint_url, region, local=local)
    return client


def _config() -> AwsConfig:
    return AwsConfig.from_env(os.environ)


def _fail(exc: DelayedDeliveryError) -> typer.Exit:
    return fail(str(exc))


@aws_app.command()
def check(
    queue: Queue,
    local: Local = False,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    buckets: BucketsFlag = None,
    bucket_name: BucketName = None,
    bucket_prefix: BucketPrefix = None,
) -> None:
    """Check QUEUE's -delay.fifo against the FIFO queue rules (DelaySeconds 900, retention ≥ 4 days, no redrive).

    With the time-bucket tier (--buckets, DELAYED_DELIVERY_LONG_DELAY_ROUTE buckets, or auto, the default, when the
    tier's ingest queue exists) also its S3 bucket (public access blocked, encryption, TLS policy, lifecycle), its
    ingest queue and DLQ, and the error queue.
    """
    try:
        endpoint_url = _endpoint(local, endpoint_url)
        config = _config()
        client = _client(endpoint_url, region, local)
        without_tier = buckets is None and config.sqs_settings.long_delay_route == "auto"
        if without_tier and has_tier(client, config.sqs_settings):
            without_tier, buckets = False, True
        tier = tier_config(False if without_tier else buckets, bucket_name, bucket_prefix, config)
        result = check_endpoint(client, queue, config.sqs_settings)
        tier_problems = check_tier(tier, endpoint_url, region, local) if tier else []
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    for fact in result.facts:
        say(styled("ok  ", "green", fact))
    if without_tier:
        say(
            styled(
                "ok  ",
                "green",
                f"no time-bucket tier (no ingest queue {config.sqs_settings.bucket_ingest_queue!r}): long_delay_route "
                "auto sends long delays through the -delay.fifo queue",
            )
        )
    if tier and not tier_problems:
        say(styled("ok  ", "green", f"time-bucket tier: s3://{tier.bucket_name}/{tier.prefix}"))
    for warning in result.warnings:
        say(styled("warn", "yellow", warning))
    for problem in (*result.problems, *tier_problems):
        say(styled("FAIL", "red", problem))
    if not result.ok or tier_problems:
        say(f"{result.delay_queue}: {len(result.problems) + len(tier_problems)} problem(s)")
        raise typer.Exit(code=1)
    say(f"{result.delay_queue}: ready for unrestricted delayed delivery")


@aws_app.command()
def create(
    queue: Queue,
    local: Local = False,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    error_queue: Annotated[str | None, typer.Option(help="Error queue (default: the error_queue setting).")] = None,
    cancellation_table: Annotated[
        str,
        typer.Option(envvar=TABLE_ENV, help="DynamoDB table of cancel / reschedule records ('' = do not create)."),
    ] = DEFAULT_TABLE,
    buckets: BucketsFlag = None,
    bucket_name: BucketName = None,
    bucket_prefix: BucketPrefix = None,
    schedule_table: Annotated[
        str,
        typer.Option(
            envvar="DELAYED_DELIVERY_SCHEDULE_TABLE", help="DynamoDB table of recurring schedules ('' = do not create)."
        ),
    ] = "delayed-delivery-schedules",
) -> None:
    """Create QUEUE, its -delay.fifo, the error queue, the cancellation and schedules tables (emulators; CDK in the
    cloud).

    With --buckets (or DELAYED_DELIVERY_LONG_DELAY_ROUTE buckets/auto) also the time-bucket tier: the S3 bucket,
    the ingest queue (DELAYED_DELIVERY_BUCKET_INGEST_QUEUE) and its -dlq.
    """
    tier_urls: dict[str, str] = {}
    try:
        endpoint_url = _endpoint(local, endpoint_url)
        config = _config()
        if error_queue:
            config = replace(config, settings=replace(config.settings, error_queue=error_queue))
        tier = tier_config(buckets, bucket_name, bucket_prefix, config)
        sqs = _client(endpoint_url, region, local)
        queues = ensure_endpoint(
            sqs,
            queue,
            config.settings,
            sqs_settings=config.sqs_settings,
            delay_visibility_timeout=DELAY_QUEUE_VISIBILITY_SECONDS,
        )
        record_endpoint(sqs, queue, queues)  # what `aws verify --local` finds the endpoint by
        if cancellation_table:
            table_endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or endpoint_url
            ensure_cancellation_table(cli_client("dynamodb", table_endpoint, region, local=local), cancellation_table)
        if schedule_table:
            from delayed_delivery.aws.schedules.table import ensure_schedule_table

            table_endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or endpoint_url
            ensure_schedule_table(cli_client("dynamodb", table_endpoint, region, local=local), schedule_table)
        if tier:
            tier_urls = create_tier(tier, endpoint_url, region, local)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    urls = {"input": queues.input_url, "delay": queues.delay_url, "error": queues.error_url}
    tables = {"cancellation_table": cancellation_table or None, "schedule_table": schedule_table or None}
    emit_json({**urls, **tables, **tier_urls})


@aws_app.command()
def send(
    queue: Queue,
    delay: Annotated[str, typer.Option("--delay", "-d", help="Delay, e.g. 90s, 2h, 40d.")],
    body: Annotated[str, typer.Option("--body", "-b", help="Message body (text).")],
    attribute: Annotated[list[str] | None, typer.Option("--attribute", "-a", help="NAME=VALUE, repeatable.")] = None,
    message_id: Annotated[str | None, typer.Option(help="Message id (default: a new UUID).")] = None,
    local: Local = False,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
) -> None:
    """Send BODY to QUEUE after DELAY; prints the route taken (JSON)."""
    attributes: dict[str, str] = {}
    for item in attribute or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise _fail(DelayedDeliveryError(f"--attribute {item!r}: use NAME=VALUE"))
        attributes[name] = value
    try:
        config = _config()
        client = _client(_endpoint(local, endpoint_url), region, local)
        sender = SqsDelayedSender(client, config.settings, sqs_settings=config.sqs_settings)
        receipt = sender.send_delayed(queue, body, delay, attributes=attributes, message_id=message_id)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    emit_json(
        {
            "message_id": receipt.message_id,
            "route": receipt.route.value,
            "queue": receipt.queue,
            "delay_seconds": receipt.delay_seconds,
            "fifo_cycles": receipt.fifo_cycles,
            "sqs_message_id": receipt.sqs_message_id,
        }
    )


#: Seconds between progress lines of ``aws requeue``.
_PROGRESS_EVERY = 5.0


@aws_app.command()
def requeue(
    queue: Annotated[
        list[str], typer.Option("--queue", "-q", help="Input queue (or its -delay.fifo) to serve; repeatable.")
    ],
    seconds: Annotated[float, typer.Option("--for", help="Run this many seconds, then stop.")] = 60.0,
    local: Annotated[bool, typer.Option("--local", help="Use moto server at 127.0.0.1:5000 (`local up`).")] = False,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="The handler's logs and metrics to stderr.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final counts as JSON.")] = False,
) -> None:
    """Run the requeue Lambda handler locally behind an SQS event source on each QUEUE's -delay.fifo.

    Example: delayed-delivery aws requeue --local --queue orders --for 60
    """
    if not (math.isfinite(seconds) and seconds > 0):
        raise _fail(DelayedDeliveryError(f"--for {seconds}: give a positive number of seconds"))
    endpoint = LOCAL_MOTO_URL if local else endpoint_url
    if not endpoint:
        raise _fail(DelayedDeliveryError("give --local (moto server on 127.0.0.1:5000) or --endpoint-url"))
    results: Counter[str] = Counter()
    errors: list[str] = []
    sink: IO[str] = err.file if verbose else _Discard()
    try:
        config = AwsConfig.from_env(os.environ)
        sqs, dynamodb = _local_clients(endpoint, cli_region(endpoint, region, local=local), local, config)
        with redirect_stdout(sink):  # Powertools writes logs and EMF metrics to stdout
            pollers = _requeue_pollers(sqs, dynamodb, config, queue, results, errors)
        say(f"requeue on {', '.join(p.queue_url.rsplit('/', 1)[-1] for p in pollers)} for {seconds:g} s", stderr=True)
        _serve(pollers, seconds, sink, results)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    _report(pollers, results, errors, as_json)


class _Discard(io.StringIO):
    """A stdout that keeps nothing (the handler's logs when not ``--verbose``)."""

    def write(self, text: str) -> int:
        return len(text)


def _local_clients(
    endpoint: str, region: str | None, local: bool, config: AwsConfig
) -> tuple[SQSClient, DynamoDBClient | None]:
    """SQS (and, when a cancellation table is configured, DynamoDB) clients on the emulator, quick to give up."""
    import boto3
    from botocore.config import Config

    key = "testing" if local and not os.environ.get("AWS_ACCESS_KEY_ID") else None
    quick = Config(connect_timeout=2, read_timeout=10, retries={"mode": "standard", "max_attempts": 2})
    options: dict[str, Any] = {"region_name": region, "aws_access_key_id": key, "aws_secret_access_key": key}
    sqs = boto3.client("sqs", endpoint_url=endpoint, config=quick, **options)
    if config.cancellation_table is None:
        return sqs, None
    # moto serves DynamoDB on the SQS port; AWS_ENDPOINT_URL_DYNAMODB splits them.
    table_endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or endpoint
    return sqs, boto3.client("dynamodb", endpoint_url=table_endpoint, config=quick, **options)


def _requeue_pollers(
    sqs: SQSClient,
    dynamodb: DynamoDBClient | None,
    config: AwsConfig,
    queues: list[str],
    results: Counter[str],
    errors: list[str],
) -> list[LocalEventSourcePoller]:
    """One local event source per delay queue, all invoking one in-package handler."""
    from botocore.exceptions import BotoCoreError, ClientError

    from delayed_delivery.aws.requeue.handler import build_handler
    from delayed_delivery.aws.sqs import translate_error
    from delayed_delivery.testing.aws import LocalEventSourcePoller

    def tally(outcome: list[RecordResult]) -> None:
        results.update(str(each.outcome) for r in outcome for each in r.per_message())

    handler = build_handler(config, sqs_client=sqs, dynamodb_client=dynamodb, on_results=tally)

    def invoke(event: dict[str, Any], context: Any) -> dict[str, Any]:
        try:
            return handler(event, context)
        except Exception as exc:  # the poller counts it and keeps the records, as Lambda would
            errors.append(f"{type(exc).__name__}: {exc}")
            raise

    pollers = []
    for name in queues:
        delay_queue = sqs_delay_queue_name(name.removesuffix("-delay.fifo"))
        try:
            url = sqs.get_queue_url(QueueName=delay_queue)["QueueUrl"]
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, delay_queue) from None
        pollers.append(LocalEventSourcePoller(sqs, url, arn, invoke))
    return pollers


def _serve(pollers: list[LocalEventSourcePoller], seconds: float, sink: IO[str], results: Counter[str]) -> None:
    """Poll every queue in turn until the time is up, with a progress line every few seconds."""
    from botocore.exceptions import BotoCoreError, ClientError

    from delayed_delivery.aws.sqs import translate_error

    start = time.monotonic()
    deadline, next_progress = start + seconds, start + _PROGRESS_EVERY
    while (now := time.monotonic()) < deadline:
        for poller in pollers:
            wait = 1 if deadline - time.monotonic() >= 1 else 0
            try:
                with redirect_stdout(sink):
                    poller.poll_once(wait)
            except (ClientError, BotoCoreError) as exc:
                raise translate_error(exc, poller.queue_url) from None
        if now >= next_progress:
            next_progress += _PROGRESS_EVERY
            say(f"{now - start:5.0f} s  {_counts(pollers, results)}", stderr=True)


def _counts(pollers: list[LocalEventSourcePoller], results: Counter[str]) -> str:
    records = sum(p.stats.records for p in pollers)
    outcomes = ", ".join(f"{name} {count}" for name, count in sorted(results.items())) or "no outcomes yet"
    return f"{records} record(s): {outcomes}"


def _report(pollers: list[LocalEventSourcePoller], results: Counter[str], errors: list[str], as_json: bool) -> None:
    """The final counts; handler errors (records kept for a retry, as Lambda does) go to stderr."""
    if errors:
        say(styled("warn", "yellow", f"{len(errors)} failed invocation(s), last: {errors[-1]}"), stderr=True)
    stats = {
        "invocations": sum(p.stats.invocations for p in pollers),
        "records": sum(p.stats.records for p in pollers),
        "failed_records": sum(p.stats.failed for p in pollers),
        "handler_errors": sum(p.stats.handler_errors for p in pollers),
    }
    if as_json:
        emit_json({**stats, "outcomes": dict(results)})
        return
    say(f"done: {stats['invocations']} invocation(s), {_counts(pollers, results)}")


aws_app.command(name="tier")(run_tier_command)  # the time-bucket tier's two functions, run locally
aws_app.command(name="verify")(run_verify_command)  # prove a deployment (docs/verify.md)
