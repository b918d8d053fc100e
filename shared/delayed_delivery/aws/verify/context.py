"""What every check receives: the target, the clients, the settings, the clock, progress, clean-up and the functions.

The functions are a port: in an account they run in Lambda and the command only waits; on an emulator the command
runs the in-package handlers itself between its receives (``FunctionHost``), as ``aws requeue --local`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from ...clock import Clock
from ...errors import DestinationNotFoundError
from ...verification import Cleanup, Mode, Progress, VerifySettings
from ..sqs import translate_error
from .target import AwsTarget

__all__ = ["AwsClients", "AwsVerifyContext", "FunctionHost", "QueueFacts", "Usage", "UsageMeter"]


class FunctionHost(Protocol):
    """The deployment's functions while probes are in flight."""

    @property
    def local(self) -> bool:
        """True when the functions run in this process (an emulator)."""
        ...

    def run_for(self, seconds: float) -> None:
        """Let the functions work for up to ``seconds`` (in an account: nothing to do, Lambda runs them)."""
        ...

    def failures(self) -> list[str]:
        """Failed invocations seen so far, newest last (locally; in an account the logs have them)."""
        ...


@dataclass(frozen=True, slots=True)
class Usage:
    """Billed requests and function time in the probe window."""

    sqs_standard_requests: float = 0.0
    sqs_fifo_requests: float = 0.0
    lambda_invocations: float = 0.0
    lambda_gb_seconds: float = 0.0
    s3_put_requests: float = 0.0
    s3_get_requests: float = 0.0
    source: str = ""


class UsageMeter(Protocol):
    """Where the probe window's requests are counted: CloudWatch in an account, request counters on an emulator."""

    def begin(self, now: datetime) -> None:
        """The probe window starts at ``now``."""
        ...

    def usage(self, context: AwsVerifyContext) -> Usage | None:
        """The window's usage, or None when it is not (yet) available."""
        ...


@dataclass(slots=True)
class AwsClients:
    """boto3 clients; the ones an emulator cannot serve may be None (their checks need a real account)."""

    sqs: Any
    s3: Any = None
    dynamodb: Any = None
    lambda_: Any = None
    events: Any = None
    cloudwatch: Any = None
    iam: Any = None


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """A queue's URL and every attribute."""

    name: str
    url: str
    attributes: dict[str, str]

    def number(self, name: str, default: int = 0) -> int:
        """An integer attribute."""
        value = self.attributes.get(name, "")
        return int(value) if value.lstrip("-").isdigit() else default


@dataclass(slots=True)
class AwsVerifyContext:
    """One run of ``aws verify``."""

    target: AwsTarget
    clients: AwsClients
    settings: VerifySettings
    clock: Clock
    progress: Progress
    cleanup: Cleanup
    functions: FunctionHost
    mode: Mode = Mode.QUICK
    run_id: str = "run"
    usage_meter: UsageMeter | None = None
    _queues: dict[str, QueueFacts | None] = field(default_factory=dict)

    def queue(self, name: str, *, fresh: bool = False) -> QueueFacts | None:
        """The queue's facts (read once unless ``fresh``), or None when it does not exist."""
        if fresh or name not in self._queues:
            self._queues[name] = self._read_queue(name)
        return self._queues[name]

    def _read_queue(self, name: str) -> QueueFacts | None:
        sqs = self.clients.sqs
        try:
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, f"reading queue {name!r}")
            if isinstance(error, DestinationNotFoundError):
                return None
            raise error from exc
        return QueueFacts(name, url, {str(k): str(v) for k, v in attributes.items()})
