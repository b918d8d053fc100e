"""``delayed-delivery aws verify``: prove a deployed stack (or an emulator with ``--local``) and print the report.

The checks live in ``delayed_delivery.aws.verify``; this module reads the options, builds the clients, the target
and (on an emulator) the local functions, and prints. Exit 0 when every check holds, 1 when any fails, 2 for a
usage error, 3 when the account (or emulator) could not be reached or refused the credential.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import typer
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from delayed_delivery.app.cli.aws_buckets import BucketName, BucketPrefix, BucketsFlag, has_tier, tier_config
from delayed_delivery.app.cli.interrupts import sigterm_as_ctrl_c
from delayed_delivery.app.cli.output import err, fail
from delayed_delivery.app.cli.verify_output import print_report, progress_printer
from delayed_delivery.app.routes.aws_clients import cli_region
from delayed_delivery.app.routes.base import LOCAL_MOTO_URL
from delayed_delivery.aws.cancellations import DEFAULT_TABLE, TABLE_ENV
from delayed_delivery.aws.config import AwsConfig
from delayed_delivery.aws.sqs import translate_error
from delayed_delivery.aws.verify import (
    PROBE_QUEUE,
    AwsClients,
    AwsTarget,
    AwsVerifyContext,
    discover_stack,
    local_target,
    verify_aws,
)
from delayed_delivery.aws.verify.usage import CloudWatchUsage, RequestTally
from delayed_delivery.clock import SystemClock
from delayed_delivery.errors import DelayedDeliveryError
from delayed_delivery.verification import Cleanup, Mode, VerifyReport, VerifySettings

__all__ = ["run_verify_command"]

#: Client settings of verify: quick to give up on a dead endpoint, patient enough for a 20 s long poll.
_CLIENT: dict[str, Any] = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 3, "mode": "standard"}}
#: The probe endpoint's -delay.fifo visibility on an emulator: 6x the requeue timeout, as the CDK construct sets it.
_PROBE_VISIBILITY = 180


def _fail(exc: BaseException) -> typer.Exit:
    return fail(str(exc))


#: Error codes of an account that does not take the credential (or lets it read nothing of the deployment).
_REFUSED = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "AuthFailure",
        "ExpiredToken",
        "ExpiredTokenException",
        "IncompleteSignature",
        "InvalidAccessKeyId",
        "InvalidClientTokenId",
        "InvalidSignatureException",
        "MissingAuthenticationToken",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
    }
)


def _refused(exc: ClientError) -> str | None:
    """The refusal's code when ``exc`` refuses the credential (401, 403 or an auth code), else None."""
    error = exc.response.get("Error", {})
    code, message = str(error.get("Code", "")), str(error.get("Message", ""))
    found = re.search(r"<Code>([^<]{1,100})</Code>", message)  # an emulator's XML answer the client did not parse
    code = found.group(1) if found and code.isdigit() else code
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code or str(status) if code in _REFUSED or status in (401, 403) else None


def _cannot_start(exc: BaseException, where: str) -> str | None:
    """Why the run cannot start when ``exc`` (or what it came from) says the account is unreachable or refused the
    credential; None for anything else (a usage error)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, NoCredentialsError | PartialCredentialsError):
            return f"{where}: no AWS credentials were found: {seen}"
        if isinstance(seen, BotoConnectionError | HTTPClientError):
            return f"{where} could not be reached: {translate_error(seen, 'connecting')}"
        if isinstance(seen, ClientError):
            code = _refused(seen)
            return f"{where} refused the credential ({code})" if code else None
        seen = seen.__cause__
    return None


def cli_client(service: str, endpoint: str | None, region: str | None, *, local: bool) -> Any:
    """A boto3 client for verify (on an emulator: fake credentials unless some are set, S3 path-style)."""
    import boto3
    from botocore.config import Config

    key = "testing" if local and not os.environ.get("AWS_ACCESS_KEY_ID") else None
    style: dict[str, Any] = {"s3": {"addressing_style": "path"}} if local else {}
    return boto3.client(
        service,  # type: ignore[call-overload]
        endpoint_url=endpoint,
        region_name=cli_region(endpoint, region, local=local),
        aws_access_key_id=key,
        aws_secret_access_key=key,
        config=Config(**_CLIENT, **style),
    )


def _clients(endpoint: str | None, region: str | None, local: bool) -> AwsClients:
    """Clients for every service verify reads; on an emulator S3 and DynamoDB may have their own endpoints."""

    def client(service: str, env: str | None = None) -> Any:
        url = (os.environ.get(env) if env else None) or endpoint
        return cli_client(service, url, region, local=local)

    clients = AwsClients(
        sqs=client("sqs"),
        s3=client("s3", "AWS_ENDPOINT_URL_S3"),
        dynamodb=client("dynamodb", "AWS_ENDPOINT_URL_DYNAMODB"),
    )
    if not local:
        clients.lambda_, clients.events = client("lambda"), client("events")
        clients.cloudwatch, clients.iam = client("cloudwatch"), client("iam")
    return clients


def _local_probe(clients: AwsClients, config: AwsConfig, cleanup: Cleanup) -> None:
    """Create the probe endpoint on the emulator when it is missing; it is deleted again when the run ends."""
    from delayed_delivery.aws.queues import ensure_endpoint

    sqs = clients.sqs
    names = (PROBE_QUEUE, f"{PROBE_QUEUE}-delay.fifo", f"{PROBE_QUEUE}-errors")
    existing = set(u.rsplit("/", 1)[-1] for u in sqs.list_queues(QueueNamePrefix=PROBE_QUEUE).get("QueueUrls", []))
    if set(names) <= existing:
        return
    made = ensure_endpoint(
        sqs,
        PROBE_QUEUE,
        config.settings,
        sqs_settings=config.sqs_settings,
        error_queue=names[2],
        visibility_timeout=_PROBE_VISIBILITY,
    )
    for url in (made.input_url, made.delay_url, made.error_url):
        cleanup.add(f"the probe queue {url.rsplit('/', 1)[-1]}", _deleter(sqs, url))


def _deleter(sqs: Any, url: str) -> Callable[[], None]:
    def delete_probe_queue() -> None:
        sqs.delete_queue(QueueUrl=url)

    return delete_probe_queue


def _local_context(
    endpoint: str,
    region: str | None,
    mode: Mode,
    queues: list[str],
    tier_options: tuple[Any, Any, Any],
) -> AwsVerifyContext:

    config = AwsConfig.from_env(os.environ)
    clients = _clients(endpoint, region, local=True)
    cleanup = Cleanup()
    try:
        return _local_run(endpoint, mode, queues, tier_options, clients, config, cleanup)
    except BaseException:
        cleanup.run()  # the probe queues made for this run
        raise


def _local_run(
    endpoint: str,
    mode: Mode,
    queues: list[str],
    tier_options: tuple[Any, Any, Any],
    clients: AwsClients,
    config: AwsConfig,
    cleanup: Cleanup,
) -> AwsVerifyContext:
    from delayed_delivery.app.local_functions import LocalAwsFunctions

    _local_probe(clients, config, cleanup)
    table = os.environ.get(TABLE_ENV, DEFAULT_TABLE).strip() or None
    buckets, bucket_name, bucket_prefix = tier_options
    if buckets is None and config.sqs_settings.long_delay_route != "buckets":
        buckets = has_tier(clients.sqs, config.sqs_settings)  # as `aws create` made it (auto takes fifo without it)
    target = local_target(
        clients.sqs,
        config.settings,
        sqs_settings=config.sqs_settings,
        description=f"emulator at {endpoint}",
        queues=queues,
        tier=tier_config(buckets, bucket_name, bucket_prefix, config),
        cancellation_table=table,
    )
    functions = LocalAwsFunctions(target, sqs=clients.sqs, s3=clients.s3, dynamodb=clients.dynamodb)
    probe = target.probe
    assert probe is not None
    tally = RequestTally([probe.name, probe.delay_queue, probe.error_queue], functions.lambda_usage)
    tally.attach(clients.sqs)
    return _context(target, clients, mode, cleanup, functions, tally)


class _CloudFunctions:
    """In an account Lambda runs the functions: nothing to do here."""

    local = False

    def run_for(self, seconds: float) -> None:
        """Nothing: the deployed functions run by themselves."""

    def failures(self) -> list[str]:
        """Unknown here: the functions' log groups have them."""
        return []


def _cloud_context(stack: str, region: str | None, mode: Mode) -> AwsVerifyContext:
    clients = _clients(None, region, local=False)
    target = discover_stack(cli_client("cloudformation", None, region, local=False), clients.lambda_, stack, region)
    memory = target.probe.function.memory_mb if target.probe else 256
    return _context(target, clients, mode, Cleanup(), _CloudFunctions(), CloudWatchUsage(memory))


def _context(
    target: AwsTarget, clients: AwsClients, mode: Mode, cleanup: Cleanup, functions: Any, meter: Any
) -> AwsVerifyContext:
    return AwsVerifyContext(
        target=target,
        clients=clients,
        settings=VerifySettings.from_env(os.environ),
        clock=SystemClock(),
        progress=progress_printer(err),
        cleanup=cleanup,
        functions=functions,
        mode=mode,
        run_id=uuid.uuid4().hex[:10],
        usage_meter=meter,
    )


def run_verify_command(
    stack: Annotated[str, typer.Option("--stack", help="The CloudFormation stack (CDK context stackName).")] = (
        "DelayedDelivery"
    ),
    region: Annotated[str | None, typer.Option("--region", envvar="AWS_DEFAULT_REGION", help="AWS region.")] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full/--quick",
            help="--quick (default): configuration and a 30 s probe, about a minute. "
            "--full: every route (-delay.fifo, the tier, cancel, reschedule), about 20 minutes.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document (progress stays on stderr).")] = (
        False
    ),
    local: Annotated[
        bool,
        typer.Option("--local", help="Check moto server at 127.0.0.1:5000 (`local up`), running the functions here."),
    ] = False,
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", help="Check another emulator (implies running the functions here).")
    ] = None,
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="Emulator: an endpoint to check (default: every one).")
    ] = None,
    buckets: BucketsFlag = None,
    bucket_name: BucketName = None,
    bucket_prefix: BucketPrefix = None,
) -> None:
    """Prove a deployment: configuration, permissions, probes through each route, cost; clean-up after.

    Exit 0 when every check holds, 1 when any fails, 2 for a usage error, 3 when the account could not be reached or
    refused the credential. docs/verify.md explains each check.

    Examples: delayed-delivery aws verify --stack DelayedDelivery --region eu-west-1
              delayed-delivery aws verify --local --full --json
    """
    mode = Mode.FULL if full else Mode.QUICK
    endpoint = endpoint_url or (LOCAL_MOTO_URL if local else None)
    try:
        return _run(endpoint, stack, region, mode, list(queue or []), (buckets, bucket_name, bucket_prefix), as_json)
    except (ClientError, BotoCoreError) as exc:
        raise _fail(translate_error(exc, f"reading {endpoint or 'the account'}")) from None


def _run(
    endpoint: str | None,
    stack: str,
    region: str | None,
    mode: Mode,
    queue: list[str],
    tier_options: tuple[Any, Any, Any],
    as_json: bool,
) -> None:
    where = f"the emulator at {endpoint}" if endpoint else f"the account (stack {stack}, {region or 'default region'})"
    try:
        try:
            if endpoint:
                ctx = _local_context(endpoint, region, mode, queue, tier_options)
            else:
                if queue or tier_options[0] is not None:
                    raise DelayedDeliveryError("--queue and --buckets are for --local: a stack names its own endpoints")
                ctx = _cloud_context(stack, region, mode)
        except (ClientError, BotoCoreError, DelayedDeliveryError) as exc:
            error = _cannot_start(exc, where)
            if error is None:
                raise
            now = SystemClock().now()
            report = VerifyReport.unreachable(
                cloud="aws", target=where, mode=mode, local=bool(endpoint), at=now, error=error
            )
            print_report(report, as_json=as_json)
            raise typer.Exit(code=report.exit_code) from None
        with sigterm_as_ctrl_c():
            report = verify_aws(ctx)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    print_report(report, as_json=as_json)
    raise typer.Exit(code=report.exit_code)
