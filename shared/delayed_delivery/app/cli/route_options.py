"""The route options every operator and schedule command takes (``--store``, ``--cloud``, ``--local``, …) and how a
library error becomes one line."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

import typer

from delayed_delivery.app.cli.output import emit_json, fail, say
from delayed_delivery.app.routes import (  # no cloud SDK at import: the routes import theirs when used
    CloudOptions,
    OperatorRoute,
    UsageError,
    open_route,
)
from delayed_delivery.errors import (
    DelayedDeliveryError,
    MessageIdConflictError,
    MessageInFlightError,
    MessagePlacedError,
    TransientError,
)

__all__ = ["RouteOptions", "error_exit", "with_route_options"]


def _route_option(flag: str, help: str, envvar: str | None = None) -> Any:
    return typer.Option(flag, envvar=envvar, help=help, rich_help_panel="Route")


@dataclass(frozen=True, slots=True)
class RouteOptions:
    """The options every operator command takes to choose and reach its route (declared once, here)."""

    store: Annotated[
        str | None,
        _route_option(
            "--store",
            "Store URL: sqlite:///file.db, sqlite:////abs/file.db or postgresql://… (env DELAYED_DELIVERY_STORE).",
            "DELAYED_DELIVERY_STORE",
        ),
    ] = None
    cloud: Annotated[
        str | None,
        _route_option(
            "--cloud",
            "aws (SQS) or azure (Storage Queues + delays table); wins over --store.",
            "DELAYED_DELIVERY_CLOUD",
        ),
    ] = None
    local: Annotated[
        bool,
        _route_option(
            "--local",
            "Use the local emulators: moto at 127.0.0.1:5000, Azurite at 10000-10002 (`delayed-delivery local up`).",
        ),
    ] = False
    endpoint_url: Annotated[
        str | None,
        _route_option("--endpoint-url", "aws: SQS endpoint URL (env AWS_ENDPOINT_URL_SQS).", "AWS_ENDPOINT_URL_SQS"),
    ] = None
    region: Annotated[str | None, _route_option("--region", "aws: region.", "AWS_DEFAULT_REGION")] = None
    connection_string: Annotated[
        str | None,
        _route_option(
            "--connection-string",
            "azure: storage connection string (UseDevelopmentStorage=true for Azurite's standard ports).",
            "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING",
        ),
    ] = None
    endpoint: Annotated[
        str,
        _route_option(
            "--endpoint",
            "azure: the endpoint that owns the delays table (table delays+SHA-1(endpoint)).",
            "DELAYED_DELIVERY_ENDPOINT",
        ),
    ] = ""
    bucket_name: Annotated[
        str | None,
        _route_option(
            "--bucket-name",
            "aws: the time-bucket tier's S3 bucket: exact pending for bucketed messages, cancel / reschedule records "
            "kept until dispatch (env DELAYED_DELIVERY_BUCKET_NAME).",
            "DELAYED_DELIVERY_BUCKET_NAME",
        ),
    ] = None
    bucket_prefix: Annotated[
        str | None,
        _route_option(
            "--bucket-prefix",
            "aws: key prefix of the tier's objects (default delayed-delivery/buckets).",
            "DELAYED_DELIVERY_BUCKET_PREFIX",
        ),
    ] = None
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False

    def open(self) -> OperatorRoute:
        """The cloud route when ``--cloud`` is given (with the tier when ``--bucket-name``), else ``--store``."""
        if self.cloud is None:
            if self.local:
                raise UsageError("--local needs --cloud aws or --cloud azure")
            return open_route(None, self.store)
        cloud = CloudOptions(
            self.cloud, self.local, self.endpoint_url, self.region, self.connection_string, self.endpoint
        )
        if self.cloud == "aws" and self.bucket_name and self.bucket_name.strip():
            from delayed_delivery.app.routes.buckets import open_bucket_route

            return open_bucket_route(cloud, self.bucket_name.strip(), self.bucket_prefix)
        return open_route(cloud, None)

    def print(self, document: dict[str, Any], text: str) -> None:
        """``document`` as JSON with ``--json``, else ``text``."""
        if self.as_json:
            emit_json(document)
        else:
            say(text)


_ROUTE_FIELDS = tuple(inspect.signature(RouteOptions).parameters.values())


def _fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as one ``error:`` line (secrets masked) and return the exit to raise."""
    return fail(message, code)


def error_exit(exc: DelayedDeliveryError, options: RouteOptions, message_id: str | None) -> typer.Exit:
    """A library error as one line: exit 1 for a message being delivered (try again), else exit 2."""
    if isinstance(exc, MessagePlacedError):  # visible on its queue by now: trying again will not help
        return _fail(str(exc), code=1)
    if isinstance(exc, MessageInFlightError):
        which = f"message {message_id!r}" if message_id else "the message"
        return _fail(f"{which} is being delivered right now; try again in a few seconds", code=1)
    if isinstance(exc, MessageIdConflictError):
        which = f"message {message_id!r}" if message_id else "a message with this id"
        return _fail(f"{which} is already pending with different content (destination, body, headers or due time)")
    hint = ""
    if options.local and isinstance(exc, TransientError) and _unreachable(str(exc)):
        hint = " (are the emulators up? start them with `delayed-delivery local up`)"
    return _fail(f"{exc}{hint}")  # one line, even for multi-line driver errors


#: What an endpoint that does not answer at all looks like (botocore's and the Azure SDK's words).
_UNREACHABLE = (
    "Could not connect",
    "cannot connect to",
    "Connect timeout",
    "EndpointConnectionError",
    "Connection refused",
)


def _unreachable(text: str) -> bool:
    """Whether an error says the endpoint could not be reached (not that it answered with an error)."""
    return any(words in text for words in _UNREACHABLE)


def with_route_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with the ``RouteOptions`` fields as its trailing options; library errors become one line, exit 2."""
    signature = inspect.signature(command)
    hints = get_type_hints(command, include_extras=True)
    own = [p.replace(annotation=hints[p.name]) for p in signature.parameters.values() if p.name != "route"]
    route_hints = get_type_hints(RouteOptions, include_extras=True)
    shared = [
        inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default, annotation=route_hints[p.name])
        for p in _ROUTE_FIELDS
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        options = RouteOptions(**{p.name: kwargs.pop(p.name) for p in _ROUTE_FIELDS})
        try:
            command(options, **kwargs)
        except DelayedDeliveryError as exc:
            raise error_exit(exc, options, kwargs.get("message_id")) from None

    parameters = [*own, *shared]
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    return wrapper
