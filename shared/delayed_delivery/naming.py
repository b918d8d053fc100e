"""Queue, table and container names, validated against each cloud's rules with clear errors."""

from __future__ import annotations

import hashlib
import re

from .errors import ConfigurationError

__all__ = [
    "azure_delays_table_name",
    "sqs_delay_queue_name",
    "sqs_input_queue_name",
    "validate_azure_container_name",
    "validate_azure_queue_name",
    "validate_azure_table_name",
    "validate_sqs_queue_name",
]

FIFO_SUFFIX = ".fifo"
DELAY_QUEUE_SUFFIX = "-delay.fifo"
_SQS = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_TABLE = re.compile(r"^[A-Za-z][A-Za-z0-9]{2,62}$")
_CONTAINER = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")


def validate_sqs_queue_name(name: str) -> str:
    """Check an SQS queue name: 1–80 letters, digits, hyphens, underscores, optional ``.fifo``."""
    stem = name[: -len(FIFO_SUFFIX)] if isinstance(name, str) and name.endswith(FIFO_SUFFIX) else name
    if not isinstance(name, str) or len(name) > 80 or not _SQS.match(stem or "!"):
        raise ConfigurationError(
            f"invalid SQS queue name {name!r}: use 1-80 letters, digits, hyphens or underscores "
            "(FIFO queues end in .fifo, counted in the 80)"
        )
    return name


def sqs_delay_queue_name(queue: str) -> str:
    """The FIFO queue holding long delays for ``queue``: ``<queue>-delay.fifo``."""
    validate_sqs_queue_name(queue)
    if queue.endswith(FIFO_SUFFIX):
        raise ConfigurationError(
            f"{queue!r} is a FIFO queue: SQS FIFO queues take no per-message delay, so they cannot be "
            "a delayed-delivery destination"
        )
    name = queue + DELAY_QUEUE_SUFFIX
    if len(name) > 80:
        raise ConfigurationError(
            f"queue name {queue!r} is too long for its delay queue {name!r} (80 characters at most): "
            f"keep input queue names to {80 - len(DELAY_QUEUE_SUFFIX)} characters"
        )
    return name


def sqs_input_queue_name(delay_queue: str) -> str:
    """The input queue that owns ``<queue>-delay.fifo``."""
    if not isinstance(delay_queue, str) or not delay_queue.endswith(DELAY_QUEUE_SUFFIX):
        raise ConfigurationError(f"{delay_queue!r} is not a delay queue (expected a name ending in -delay.fifo)")
    return validate_sqs_queue_name(delay_queue[: -len(DELAY_QUEUE_SUFFIX)])


def validate_azure_table_name(name: str) -> str:
    """Check an Azure table name: 3–63 letters and digits, starting with a letter."""
    if not isinstance(name, str) or not _TABLE.match(name) or name.lower() == "tables":
        raise ConfigurationError(
            f"invalid Azure table name {name!r}: use 3-63 letters and digits, starting with a letter"
        )
    return name


def _validate_lowercase_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _CONTAINER.match(name):
        raise ConfigurationError(
            f"invalid Azure {kind} name {name!r}: use 3-63 lowercase letters, digits and single hyphens, "
            "starting and ending with a letter or digit"
        )
    return name


def validate_azure_container_name(name: str) -> str:
    """Check a blob container name."""
    return _validate_lowercase_name("blob container", name)


def validate_azure_queue_name(name: str) -> str:
    """Check a storage queue name."""
    return _validate_lowercase_name("queue", name)


def azure_delays_table_name(endpoint: str) -> str:
    """``delays`` + hex SHA-1 of the endpoint name (the NServiceBus Azure scheme); also a valid container name."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ConfigurationError("the endpoint name must be a non-empty string")
    return "delays" + hashlib.sha1(endpoint.encode("utf-8"), usedforsecurity=False).hexdigest()
