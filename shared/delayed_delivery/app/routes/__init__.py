"""Operator routes: one interface (``OperatorRoute``) over a SQL store, the Azure delays table and SQS.

Cloud SDKs are imported inside the routes, so ``delayed-delivery`` runs without the extras until a route is used.

Fixed local defaults (``--local``, and what ``delayed-delivery local up`` starts):

* SQS: moto server at ``http://127.0.0.1:5000``, region ``us-east-1``, credentials ``testing``.
* Azure: Azurite's standard ports 10000 (blob), 10001 (queue), 10002 (table) with the development account,
  i.e. what ``UseDevelopmentStorage=true`` means (the Python SDK does not expand that shortcut; the route does).
"""

from __future__ import annotations

from delayed_delivery.app.routes.azure import AzureTableRoute
from delayed_delivery.app.routes.base import (
    LOCAL_AZURITE_PORTS,
    LOCAL_MOTO_PORT,
    LOCAL_MOTO_URL,
    LOCAL_REGION,
    BacklogPeriod,
    CancelRequest,
    CancelResult,
    Capability,
    CloudOptions,
    OperatorRoute,
    PendingReport,
    QueueDepth,
    RecordReceipt,
    RescheduleRequest,
    RescheduleResult,
    SendResult,
    UsageError,
    check_pending,
    check_request,
    local_azure_connection_string,
)
from delayed_delivery.app.routes.sqs import SqsOperatorRoute
from delayed_delivery.app.routes.store import StoreOperatorRoute
from delayed_delivery.errors import ConfigurationError, extra_missing

__all__ = [
    "LOCAL_AZURITE_PORTS",
    "LOCAL_MOTO_PORT",
    "LOCAL_MOTO_URL",
    "LOCAL_REGION",
    "AzureTableRoute",
    "BacklogPeriod",
    "CancelRequest",
    "CancelResult",
    "Capability",
    "CloudOptions",
    "OperatorRoute",
    "PendingReport",
    "QueueDepth",
    "RecordReceipt",
    "RescheduleRequest",
    "RescheduleResult",
    "SendResult",
    "SqsOperatorRoute",
    "StoreOperatorRoute",
    "UsageError",
    "check_pending",
    "check_request",
    "local_azure_connection_string",
    "open_cloud_route",
    "open_route",
]


def open_cloud_route(options: CloudOptions) -> OperatorRoute:
    """The route for ``options.cloud`` (``aws`` or ``azure``)."""
    if options.cloud == "aws":
        try:
            return SqsOperatorRoute(options)
        except ImportError as exc:
            raise extra_missing("the aws route", "cli", "aws") from exc
    if options.cloud == "azure":
        try:
            return AzureTableRoute(options)
        except ImportError as exc:
            raise extra_missing("the azure route", "cli", "azure") from exc
    raise ConfigurationError(f"unknown cloud {options.cloud!r}: use aws or azure")


def open_route(cloud: CloudOptions | None, store: str | None) -> OperatorRoute:
    """The cloud route when ``cloud`` is given (it wins), else the SQL store at ``store``, opened on first use."""
    if cloud is None:
        return StoreOperatorRoute(store)
    if cloud.cloud not in ("aws", "azure"):
        raise UsageError(f"--cloud {cloud.cloud!r}: use aws or azure")
    return open_cloud_route(cloud)
