"""``azure verify``: prove a Bicep deployment (or Azurite with ``--local``): storage, timer, roles, alerts, probes."""

from __future__ import annotations

from .context import PROBE_QUEUE, AzureTarget, AzureVerifyContext, Dispatcher
from .run import verify_azure

__all__ = ["PROBE_QUEUE", "AzureTarget", "AzureVerifyContext", "Dispatcher", "verify_azure"]
