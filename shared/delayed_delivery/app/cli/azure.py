"""``delayed-delivery azure …``: package the function app, create the storage resources, send, dispatch locally."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from delayed_delivery.app.cli.output import emit_json, fail, say
from delayed_delivery.app.cli.verify_azure import run_verify_command
from delayed_delivery.app.routes.base import azure_connection, require_endpoint
from delayed_delivery.azure.config import ENV_CONNECTION, ENV_ENDPOINT, AzureClients, AzureDelayedDeliveryConfig
from delayed_delivery.errors import DelayedDeliveryError
from delayed_delivery.naming import azure_delays_table_name, validate_azure_queue_name

azure_app = typer.Typer(
    name="azure", help="Azure Storage Queues: package, set up, send, dispatch.", no_args_is_help=True
)

Connection = Annotated[
    str | None,
    typer.Option(
        "--connection-string",
        envvar=ENV_CONNECTION,
        help="Storage connection string (UseDevelopmentStorage=true: Azurite on 10000-10002).",
    ),
]
Endpoint = Annotated[
    str,
    typer.Option("--endpoint", envvar=ENV_ENDPOINT, help="The endpoint that owns the delays table (required)."),
]
Local = Annotated[
    bool,
    typer.Option("--local", help="Use Azurite on 127.0.0.1:10000-10002, as `delayed-delivery local up` starts it."),
]


def _config(connection: str | None, endpoint: str, local: bool = False) -> AzureDelayedDeliveryConfig:
    env = dict(os.environ)
    env[ENV_ENDPOINT] = require_endpoint(endpoint)
    connection = azure_connection(connection, local)
    if connection:
        env[ENV_CONNECTION] = connection
    return AzureDelayedDeliveryConfig.from_env(env)


def _fail(exc: DelayedDeliveryError) -> typer.Exit:
    return fail(str(exc))


@azure_app.command()
def package(
    out: Annotated[Path, typer.Argument(help="Output folder (created; an earlier build is replaced).")],
) -> None:
    """Build the function-app folder for `func azure functionapp publish <app>`."""
    from delayed_delivery.azure.packaging import build_function_app

    try:
        folder = build_function_app(out)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    say(f"function app written to {folder}; publish with: cd {folder} && func azure functionapp publish <app>")


@azure_app.command()
def names(endpoint: Endpoint) -> None:
    """Print the default delays table and container name for ENDPOINT (for Bicep's delaysName)."""
    try:
        name = azure_delays_table_name(require_endpoint(endpoint))
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    emit_json({"endpoint": endpoint, "table": name, "container": name})


@azure_app.command()
def setup(
    endpoint: Endpoint,
    local: Local = False,
    connection: Connection = None,
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="A destination queue to create too (repeatable).")
    ] = None,
) -> None:
    """Create the delays table, the lease container and blobs, the error queue and any --queue destinations.

    Example: delayed-delivery azure setup --local --endpoint shop --queue orders --queue billing
    """
    from delayed_delivery.azure.runner import AzureDispatcherHost

    queues = list(dict.fromkeys(queue or []))
    try:
        for name in queues:  # every name is checked before anything is created
            validate_azure_queue_name(name)
        config = _config(connection, endpoint, local)
        host = AzureDispatcherHost(config, AzureClients.create(config, fail_fast=True))
        host.setup_infrastructure()
        for name in queues:
            host.transport.create_queue(name)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    created = f", queue(s) {', '.join(queues)}" if queues else ""
    shards = host.config.shards  # what the table records (written now if it recorded none)
    say(f"ready: table {config.table_name}, container {config.container_name}, {shards} shard(s){created}")


@azure_app.command()
def send(
    queue: Annotated[str, typer.Option("--queue", "-q", help="Destination queue.")],
    delay: Annotated[str, typer.Option("--delay", "-d", help="Delay, e.g. 90s, 2h, 40d.")],
    endpoint: Endpoint,
    body: Annotated[str, typer.Option("--body", "-b", help="Message body (UTF-8 text).")] = "",
    cancellable: Annotated[bool, typer.Option(help="Keep it in the table so it can be cancelled.")] = False,
    local: Local = False,
    connection: Connection = None,
) -> None:
    """Send one delayed message and print where it went (JSON)."""
    from delayed_delivery.azure.sender import AzureDelayedSender

    try:
        config = _config(connection, endpoint, local)
        sender = AzureDelayedSender.from_config(config, AzureClients.create(config, fail_fast=True))
        result = sender.send(queue, body.encode(), delay=delay, cancellable=cancellable)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    emit_json({"message_id": result.message_id, "route": result.route, "due_at": result.due_at.isoformat()})


@azure_app.command()
def dispatch(
    endpoint: Endpoint,
    seconds: Annotated[float, typer.Option(help="How long to dispatch.")] = 50.0,
    local: Local = False,
    connection: Connection = None,
    schedules: Annotated[
        bool,
        typer.Option(help="First run the schedule timer once: recurring schedules' occurrences due within the lead."),
    ] = False,
) -> None:
    """Run the dispatcher here for SECONDS (what one timer run does), then print a summary (JSON)."""
    import os

    from delayed_delivery.azure.runner import AzureDispatcherHost

    try:
        host = AzureDispatcherHost(_config(connection, endpoint, local))
        materialized: dict[str, float] | None = None
        if schedules:
            from delayed_delivery.azure.schedules.timer import timer_for_host

            host.setup_infrastructure()
            materialized = timer_for_host(host, os.environ).run().summary()
        summary = host.run(budget=seconds)
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    done = {"enabled": summary.enabled, "dispatched": summary.dispatched, "error_queue": summary.moved_to_error_queue}
    emit_json(done if materialized is None else {**done, "schedules": materialized})


@azure_app.command()
def reshard(
    endpoint: Endpoint,
    to: Annotated[int, typer.Option("--to", help="The new shard count (1-1000).")],
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for running timer runs to give their leases back.")
    ] = 120,
    local: Local = False,
    connection: Connection = None,
) -> None:
    """Change the delays table's shard count: move every message to its new partition (offline; docs/azure.md).

    Stop the senders first; the function app may keep running (its runs refuse to start until this ends), or stop it
    so this does not wait for a run to end. Safe to run again: it finishes an interrupted reshard.
    """
    from delayed_delivery.azure.reshard import reshard as move

    try:
        config = _config(connection, endpoint, local)
        clients = AzureClients.create(config, fail_fast=True)
        result = move(
            clients.tables.get_table_client(config.table_name),
            clients.blobs.get_container_client(config.container_name),
            to,
            configured=config.shards,
            lease_seconds=config.lease_seconds,
            wait_seconds=wait,
            progress=lambda line: say(line, stderr=True),
        )
    except DelayedDeliveryError as exc:
        raise _fail(exc) from None
    emit_json(
        {
            "table": result.table,
            "shards_before": result.before,
            "shards": result.after,
            "moved": result.moved,
            "kept": result.kept,
            "left_in_place": result.left,
        }
    )


azure_app.command(name="verify")(run_verify_command)  # prove a deployment (docs/verify.md)
