"""``delayed-delivery azure verify``: prove a Bicep deployment (or Azurite with ``--local``) and print the report.

The checks live in ``delayed_delivery.azure.verify``; this module reads the options (and the role and alert listings
the ``az`` CLI prints), builds the clients and the target, on an emulator the local dispatcher, and prints. Before
anything is checked it reads the probe queue once: storage that cannot be reached, or that refuses the credential,
ends the run with exit 3 (and, with ``--json``, one document saying so).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from delayed_delivery.app.cli.interrupts import sigterm_as_ctrl_c
from delayed_delivery.app.cli.output import err, fail
from delayed_delivery.app.cli.verify_output import print_report, progress_printer
from delayed_delivery.app.emulators import AZURITE_ACCOUNT
from delayed_delivery.app.routes.base import azure_connection, require_endpoint
from delayed_delivery.azure.config import ENV_CONNECTION, ENV_ENDPOINT, AzureClients, AzureDelayedDeliveryConfig
from delayed_delivery.clock import SystemClock
from delayed_delivery.errors import ConfigurationError, DelayedDeliveryError
from delayed_delivery.naming import validate_azure_queue_name
from delayed_delivery.verification import PROBE_QUEUE, Cleanup, Mode, VerifyReport, VerifySettings

if TYPE_CHECKING:  # the Azure SDK loads when azure verify runs, not for every command
    from delayed_delivery.azure.verify import AzureVerifyContext

__all__ = ["run_verify_command"]

#: A listing bigger than this is not what `az` prints for one identity or one resource group.
_MAX_LISTING_BYTES = 10 * 1024 * 1024


class _LocalDispatcher:
    """The dispatcher run here, between the probe queue's reads (it writes no heartbeat: it is not the timer)."""

    local = True

    def __init__(self, config: AzureDelayedDeliveryConfig, clients: AzureClients) -> None:
        from delayed_delivery.azure.runner import AzureDispatcherHost

        self.host = AzureDispatcherHost(config, clients, heartbeat=False)

    def run_for(self, seconds: float) -> None:
        """One short timer run."""
        self.host.run(budget=max(0.1, seconds))


class _Timer:
    """In Azure the function app's timer dispatches: nothing to run here."""

    local = False

    def run_for(self, seconds: float) -> None:
        """Nothing: the timer runs by itself."""


def _listing(path: Path | None, what: str) -> Sequence[Mapping[str, Any]] | None:
    """A JSON list of objects from ``path`` (an `az` listing), or None when no path was given."""
    if path is None:
        return None
    try:
        if path.stat().st_size > _MAX_LISTING_BYTES:
            raise ConfigurationError(f"{what} {path}: larger than 10 MiB, not an az listing")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"{what} {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{what} {path}: not JSON ({exc})") from None
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise ConfigurationError(f"{what} {path}: expected a JSON list of objects, as `az … list -o json` prints")
    return data


def _config(connection: str | None, endpoint: str, local: bool) -> AzureDelayedDeliveryConfig:
    env = dict(os.environ)
    env[ENV_ENDPOINT] = require_endpoint(endpoint)
    connection = azure_connection(connection, local)
    if connection:
        env[ENV_CONNECTION] = connection
    return AzureDelayedDeliveryConfig.from_env(env)


def _local_probe_queue(clients: AzureClients, name: str, cleanup: Cleanup) -> bool:
    """On an emulator: create the probe queue when missing (True); it is deleted again when the run ends."""
    from azure.core.exceptions import ResourceExistsError

    queue = clients.queues.get_queue_client(name)
    try:
        queue.create_queue()
    except ResourceExistsError:
        return False
    cleanup.add(f"the probe queue {name}", queue.delete_queue)
    return True


class _CannotStart(Exception):
    """The storage account could not be reached or refused the credential: nothing can be checked."""

    def __init__(self, where: str, local: bool, why: str) -> None:
        super().__init__(f"{where} {why}")
        self.where, self.local = where, local


def _reach(clients: AzureClients, where: str, local: bool, probe_queue: str) -> None:
    """Read the probe queue's properties once (absent is fine); ``_CannotStart`` when the account does not answer or
    refuses the credential."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    from delayed_delivery.azure.sdk_errors import unreachable_text

    try:
        clients.queues.get_queue_client(probe_queue).get_queue_properties()
    except ResourceNotFoundError:
        return
    except (ServiceRequestError, ServiceResponseError) as exc:
        raise _CannotStart(where, local, f"could not be reached: {unreachable_text(str(exc.message))}") from exc
    except (ClientAuthenticationError, HttpResponseError) as exc:
        if isinstance(exc, ClientAuthenticationError) or exc.status_code in (401, 403):
            code = getattr(exc, "error_code", None) or exc.status_code or type(exc).__name__
            code = getattr(code, "value", code)  # the SDK's StorageErrorCode enum: its text
            raise _CannotStart(where, local, f"refused the credential ({code})") from exc
        raise


def _cli_options(endpoint: str, local_flag: bool, connection: str | None) -> str:
    """How the other ``azure`` commands are told this deployment (for the fixes; a connection string is not printed)."""
    options = f"--endpoint {endpoint.strip() or '<endpoint>'}"
    if local_flag and not connection:
        return f"--local {options}"
    if connection and os.environ.get(ENV_CONNECTION) != connection:
        return f"{options} --connection-string <the same connection string>"
    return options


def _context(
    config: AzureDelayedDeliveryConfig,
    local: bool,
    mode: Mode,
    probe_queue: str,
    listings: tuple[Path | None, Path | None],
    cli_options: str,
) -> AzureVerifyContext:
    from azure.core.exceptions import AzureError

    from delayed_delivery.azure.schedules.config import ENV_SCHEDULES, AzureScheduleConfig
    from delayed_delivery.azure.sdk_errors import translate
    from delayed_delivery.azure.verify import AzureTarget, AzureVerifyContext

    clients = AzureClients.create(config, fail_fast=True)
    local = local or clients.queues.account_name == AZURITE_ACCOUNT  # Azurite's account: an emulator, whatever says
    cleanup = Cleanup()
    where = "Azurite" if local else f"storage account {clients.queues.account_name}"
    schedules = AzureScheduleConfig.from_env(os.environ, config.table_name)
    target = AzureTarget(
        config=config,
        description=f"{where}, delays table {config.table_name}",
        local=local,
        probe_queue=probe_queue,
        role_assignments=_listing(listings[0], "--role-assignments"),
        alert_rules=_listing(listings[1], "--alert-rules"),
        schedules_table=schedules.table_name,
        schedules_on=os.environ.get(ENV_SCHEDULES, "").strip().lower() == "true",
        cli_options=cli_options,
    )
    _reach(clients, where, local, probe_queue)
    made = False
    if local:
        try:
            made = _local_probe_queue(clients, probe_queue, cleanup)
        except AzureError as exc:
            raise translate(exc, f"creating the probe queue {probe_queue}") from exc
    context = AzureVerifyContext(
        target=target,
        clients=clients,
        settings=VerifySettings.from_env(os.environ),
        clock=SystemClock(),
        progress=progress_printer(err),
        cleanup=cleanup,
        dispatcher=_LocalDispatcher(config, clients) if local else _Timer(),
        mode=mode,
        run_id=uuid.uuid4().hex[:10],
    )
    context.notes["probe_queue_made"] = made
    return context


EndpointOption = Annotated[
    str, typer.Option("--endpoint", envvar=ENV_ENDPOINT, help="The endpoint that owns the delays table.")
]

ConnectionOption = Annotated[
    str | None,
    typer.Option(
        "--connection-string",
        envvar=ENV_CONNECTION,
        help="Storage connection string (else the "
        "account in DELAYED_DELIVERY_STORAGE_ACCOUNT with your Azure sign-in).",
    ),
]

LocalOption = Annotated[
    bool, typer.Option("--local", help="Check Azurite on 127.0.0.1:10000-10002, running the dispatcher here.")
]

FullOption = Annotated[
    bool,
    typer.Option(
        "--full/--quick",
        help="--quick (default): storage, timer, roles, a native "
        "and a table probe, about 2 minutes. --full: also a cancelled probe and a "
        "lease left to expire.",
    ),
]

AsJsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document (progress stays on stderr).")]

ProbeQueueOption = Annotated[str, typer.Option("--probe-queue", help="The probe queue (Bicep: deployVerifyProbe).")]

RoleAssignmentsOption = Annotated[
    Path | None,
    typer.Option(
        "--role-assignments",
        help="`az role assignment list --assignee <identityClientId> --all -o "
        "json` output: checks the identity's roles and scopes.",
    ),
]

AlertRulesOption = Annotated[
    Path | None,
    typer.Option("--alert-rules", help="`az monitor scheduled-query list -g <resource group> -o json` output."),
]


def run_verify_command(
    endpoint: EndpointOption = "",
    connection: ConnectionOption = None,
    local: LocalOption = False,
    full: FullOption = False,
    as_json: AsJsonOption = False,
    probe_queue: ProbeQueueOption = PROBE_QUEUE,
    role_assignments: RoleAssignmentsOption = None,
    alert_rules: AlertRulesOption = None,
) -> None:
    """Prove a deployment: storage, the timer's heartbeat, roles and scopes, alerts, lease and visibility rules,
    probes through the native and table routes; clean-up after.

    Exit 0 when every check holds, 1 when any fails, 2 for a usage error, 3 when the storage account could not be
    reached or refused the credential. docs/verify.md explains each check.

    Example: delayed-delivery azure verify --endpoint orders --role-assignments roles.json --alert-rules alerts.json
    """
    from delayed_delivery.azure.verify import verify_azure

    mode = Mode.FULL if full else Mode.QUICK
    try:
        validate_azure_queue_name(probe_queue)
        config = _config(connection, endpoint, local)
        options = _cli_options(endpoint, local, connection)
        ctx = _context(config, local, mode, probe_queue, (role_assignments, alert_rules), options)
        with sigterm_as_ctrl_c():
            report = verify_azure(ctx)
    except _CannotStart as exc:
        now = SystemClock().now()
        report = VerifyReport.unreachable(
            cloud="azure", target=exc.where, mode=mode, local=exc.local, at=now, error=str(exc)
        )
    except DelayedDeliveryError as exc:
        raise fail(str(exc)) from None
    print_report(report, as_json=as_json)
    raise typer.Exit(code=report.exit_code)
