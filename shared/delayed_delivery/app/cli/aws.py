"""``delayed-delivery aws …``: check an endpoint's queues, create them, send a delayed message.

Every command takes ``--endpoint-url`` (or ``AWS_ENDPOINT_URL_SQS``, e.g. a local moto server) and
``--region``; settings such as ``DELAYED_DELIVERY_FIFO_QUEUE_DELAY`` come from the environment.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from delayed_delivery.aws.cancellations import DEFAULT_TABLE, TABLE_ENV, ensure_cancellation_table
from delayed_delivery.aws.queues import check_endpoint, ensure_endpoint
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.errors import DelayedDeliveryError
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["aws_app"]

aws_app = typer.Typer(
    name="aws",
    help="SQS unrestricted delayed delivery: check, create and send.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_out = Console()
_err = Console(stderr=True)

EndpointUrl = Annotated[
    str | None, typer.Option("--endpoint-url", envvar="AWS_ENDPOINT_URL_SQS", help="SQS endpoint (e.g. moto server).")
]
Region = Annotated[str | None, typer.Option("--region", envvar="AWS_DEFAULT_REGION", help="AWS region.")]
Queue = Annotated[str, typer.Option("--queue", "-q", help="The endpoint's input queue (or its -delay.fifo).")]


def _client(endpoint_url: str | None, region: str | None) -> SQSClient:
    import boto3

    return boto3.client("sqs", endpoint_url=endpoint_url, region_name=region)


def _settings() -> DelayedDeliverySettings:
    return DelayedDeliverySettings.from_env(os.environ)


def _fail(exc: DelayedDeliveryError) -> typer.Exit:
    _err.print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(code=2)


@aws_app.command()
def check(queue: Queue, endpoint_url: EndpointUrl = None, region: Region = None) -> None:
    """Check QUEUE's -delay.fifo as the seed requires (delay, retention ≥ 4 days, no redrive); exit 1 if not."""
    try:
        result = check_endpoint(_client(endpoint_url, region), queue, _settings())
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    for fact in result.facts:
        _out.print(f"[green]ok[/green]   {fact}", highlight=False)
    for warning in result.warnings:
        _out.print(f"[yellow]warn[/yellow] {warning}", highlight=False)
    for problem in result.problems:
        _out.print(f"[red]FAIL[/red] {problem}", highlight=False)
    if not result.ok:
        _out.print(f"{result.delay_queue}: {len(result.problems)} problem(s)", highlight=False)
        raise typer.Exit(code=1)
    _out.print(f"{result.delay_queue}: ready for unrestricted delayed delivery", highlight=False)


@aws_app.command()
def create(
    queue: Queue,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    error_queue: Annotated[str | None, typer.Option(help="Error queue (default: the error_queue setting).")] = None,
    cancellation_table: Annotated[
        str,
        typer.Option(envvar=TABLE_ENV, help="DynamoDB table of cancel / reschedule records ('' = do not create)."),
    ] = DEFAULT_TABLE,
) -> None:
    """Create QUEUE, its -delay.fifo, the error queue and the cancellation table (emulators; CDK in the cloud)."""
    try:
        queues = ensure_endpoint(_client(endpoint_url, region), queue, _settings(), error_queue=error_queue)
        if cancellation_table:
            import boto3

            ensure_cancellation_table(
                boto3.client("dynamodb", endpoint_url=endpoint_url, region_name=region), cancellation_table
            )
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    urls = {"input": queues.input_url, "delay": queues.delay_url, "error": queues.error_url}
    _out.print_json(json.dumps({**urls, "cancellation_table": cancellation_table or None}))


@aws_app.command()
def send(
    queue: Queue,
    delay: Annotated[str, typer.Option("--delay", "-d", help="Delay, e.g. 90s, 2h, 40d.")],
    body: Annotated[str, typer.Option("--body", "-b", help="Message body (text).")],
    attribute: Annotated[list[str] | None, typer.Option("--attribute", "-a", help="NAME=VALUE, repeatable.")] = None,
    message_id: Annotated[str | None, typer.Option(help="Message id (default: a new UUID).")] = None,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
) -> None:
    """Send BODY to QUEUE after DELAY; prints the route taken."""
    attributes: dict[str, str] = {}
    for item in attribute or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise _fail(DelayedDeliveryError(f"--attribute {item!r}: use NAME=VALUE"))
        attributes[name] = value
    try:
        sender = SqsDelayedSender(_client(endpoint_url, region), _settings())
        receipt = sender.send_delayed(queue, body, delay, attributes=attributes, message_id=message_id)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    _out.print_json(
        json.dumps(
            {
                "message_id": receipt.message_id,
                "route": receipt.route.value,
                "queue": receipt.queue,
                "delay_seconds": receipt.delay_seconds,
                "fifo_cycles": receipt.fifo_cycles,
                "sqs_message_id": receipt.sqs_message_id,
            }
        )
    )
