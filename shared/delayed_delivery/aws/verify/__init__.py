"""``aws verify``: prove a deployment in the user's own account (or on moto): configuration, permissions, probes."""

from __future__ import annotations

from .context import AwsClients, AwsVerifyContext, FunctionHost, Usage, UsageMeter
from .run import verify_aws
from .target import PROBE_QUEUE, AwsTarget, discover_stack, local_target

__all__ = [
    "PROBE_QUEUE",
    "AwsClients",
    "AwsTarget",
    "AwsVerifyContext",
    "FunctionHost",
    "Usage",
    "UsageMeter",
    "discover_stack",
    "local_target",
    "verify_aws",
]
