"""What ``aws verify`` looks at: the endpoints, the time-bucket tier, the probe endpoint and the stack's alarms.

In an account the target comes from the CloudFormation stack: its resources and outputs, and each function's own
configuration (handler, environment, timeout), so the checks compare the deployment with itself rather than with
the defaults. On an emulator (``--local``) there is no stack: the queues are found by name and the functions are the
in-package handlers run locally, with the timeouts the CDK construct gives them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...errors import ConfigurationError
from ...settings import DelayedDeliverySettings
from ...verification import PROBE_QUEUE
from ..queues import recorded_endpoints
from ..settings import SqsSettings
from ..sqs import translate_error
from ..tier.config import DEFAULT_PREFIX, INGEST_TIMEOUT_SECONDS, INGEST_WINDOW_SECONDS, BucketTierConfig, TierSettings

__all__ = [
    "INGEST_BATCHING_WINDOW",
    "INGEST_TIMEOUT",
    "PROBE_QUEUE",
    "REQUEUE_HANDLER",
    "REQUEUE_TIMEOUT",
    "TIMER_TIMEOUT",
    "AwsTarget",
    "EndpointTarget",
    "TierTarget",
    "discover_stack",
    "local_target",
]

#: The function timeouts and batching window the CDK construct deploys (and the local runs stand in for).
REQUEUE_TIMEOUT = 30.0
INGEST_TIMEOUT = float(INGEST_TIMEOUT_SECONDS)
INGEST_BATCHING_WINDOW = float(INGEST_WINDOW_SECONDS)
TIMER_TIMEOUT = 300.0
#: The handlers by dotted name, as the stack deploys them.
REQUEUE_HANDLER = "functions.aws.requeue.handler"
INGEST_HANDLER = "functions.aws.bucket_ingest.handler"
TIMER_HANDLER = "functions.aws.bucket_timer.handler"
_SERVICE_PREFIX = "delayed-delivery-"


@dataclass(frozen=True, slots=True)
class FunctionTarget:
    """A deployed function: its name, role and timeout (``name`` None: run locally by the command)."""

    name: str | None
    timeout: float
    role_arn: str | None = None
    reserved_concurrency: int | None = None
    memory_mb: int = 256
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EndpointTarget:
    """One endpoint: its input queue name, its error queue and the requeue function serving its ``-delay.fifo``."""

    name: str
    error_queue: str
    function: FunctionTarget

    @property
    def delay_queue(self) -> str:
        """``<name>-delay.fifo``."""
        return f"{self.name}-delay.fifo"


@dataclass(frozen=True, slots=True)
class TierTarget:
    """The time-bucket tier: its configuration (bucket, prefix, queues, sizes) and its two functions."""

    config: BucketTierConfig
    ingest: FunctionTarget
    timer: FunctionTarget
    schedule_rule: str | None = None

    @property
    def ingest_dlq(self) -> str:
        """``<ingest>-dlq``."""
        return f"{self.config.sqs_settings.bucket_ingest_queue}-dlq"


@dataclass(frozen=True, slots=True)
class AwsTarget:
    """Everything the checks look at; ``local`` when it is an emulator and the functions run here."""

    description: str
    local: bool
    settings: DelayedDeliverySettings
    endpoints: tuple[EndpointTarget, ...]
    probe: EndpointTarget | None = None
    tier: TierTarget | None = None
    cancellation_table: str | None = None
    alarms: tuple[str, ...] = ()
    stack: str | None = None
    #: The SQS route's settings (native cap, hop) as deployed.
    sqs_settings: SqsSettings = field(default_factory=SqsSettings)

    @property
    def all_endpoints(self) -> tuple[EndpointTarget, ...]:
        """The endpoints and the probe endpoint."""
        return (*self.endpoints, *((self.probe,) if self.probe else ()))


def local_target(
    sqs: Any,
    settings: DelayedDeliverySettings,
    *,
    sqs_settings: SqsSettings | None = None,
    description: str,
    queues: Sequence[str] = (),
    tier: BucketTierConfig | None = None,
    cancellation_table: str | None = None,
    probe: bool = True,
) -> AwsTarget:
    """The endpoints on an emulator: ``queues`` (or every one ``aws create`` made), the tier and the probe."""
    names = [q.removesuffix("-delay.fifo") for q in queues] or _listed_endpoints(sqs)
    names = [n for n in dict.fromkeys(names) if n != PROBE_QUEUE]
    requeue = FunctionTarget(None, REQUEUE_TIMEOUT)
    endpoints = tuple(EndpointTarget(n, settings.error_queue, requeue) for n in names)
    tier_target = (
        TierTarget(tier, FunctionTarget(None, INGEST_TIMEOUT), FunctionTarget(None, TIMER_TIMEOUT, None, 1))
        if tier is not None
        else None
    )
    return AwsTarget(
        description=description,
        local=True,
        settings=settings,
        sqs_settings=sqs_settings or SqsSettings(),
        endpoints=endpoints,
        probe=EndpointTarget(PROBE_QUEUE, f"{PROBE_QUEUE}-errors", requeue) if probe else None,
        tier=tier_target,
        cancellation_table=cancellation_table,
    )


def _listed_endpoints(sqs: Any) -> list[str]:
    """The endpoints ``aws create`` made (by the tag it puts on their queues), whichever of their queues is left."""
    return recorded_endpoints(sqs)


def discover_stack(cloudformation: Any, lambda_client: Any, stack: str, region: str | None) -> AwsTarget:
    """The target from a deployed stack: its outputs, resources and each function's configuration."""
    try:
        described = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
        resources = _stack_resources(cloudformation, stack)
    except (ClientError, BotoCoreError) as exc:
        error = translate_error(exc, f"reading the CloudFormation stack {stack!r}")
        if "does not exist" in str(exc):
            raise ConfigurationError(
                f"no CloudFormation stack {stack!r} in {region or 'the default region'}: give --stack (the "
                "stackName context, default DelayedDelivery) and --region of the deployment"
            ) from exc
        raise error from exc
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in described.get("Outputs", [])}
    functions = [_function(lambda_client, name) for name in resources.get("AWS::Lambda::Function", [])]
    requeue = {f["service"]: f for f in functions if f["handler"] == REQUEUE_HANDLER}
    env = _deployed_env(functions)
    settings = DelayedDeliverySettings.from_env(env)
    endpoints = []
    probe_name = outputs.get("ProbeQueue") or None
    probe = None
    for url in resources.get("AWS::SQS::Queue", []):
        name = url.rsplit("/", 1)[-1]
        if not name.endswith("-delay.fifo"):
            continue
        endpoint = _endpoint(name.removesuffix("-delay.fifo"), requeue)
        if endpoint.name == probe_name:
            probe = endpoint
        else:
            endpoints.append(endpoint)
    return AwsTarget(
        description=f"stack {stack} ({region or 'default region'})",
        local=False,
        settings=settings,
        sqs_settings=SqsSettings.from_env(env),
        endpoints=tuple(sorted(endpoints, key=lambda e: e.name)),
        probe=probe,
        tier=_tier(outputs, functions, resources, env),
        cancellation_table=outputs.get("CancellationTable") or None,
        alarms=tuple(sorted(resources.get("AWS::CloudWatch::Alarm", []))),
        stack=stack,
    )


def _stack_resources(cloudformation: Any, stack: str) -> dict[str, list[str]]:
    """Physical ids by resource type (every page)."""
    found: dict[str, list[str]] = {}
    token: str | None = None
    while True:
        page = cloudformation.list_stack_resources(StackName=stack, **({"NextToken": token} if token else {}))
        for item in page.get("StackResourceSummaries", []):
            if item.get("PhysicalResourceId"):
                found.setdefault(item["ResourceType"], []).append(item["PhysicalResourceId"])
        token = page.get("NextToken")
        if not token:
            return found


def _function(lambda_client: Any, name: str) -> dict[str, Any]:
    """The parts of a function's configuration the checks use."""
    try:
        config = lambda_client.get_function_configuration(FunctionName=name)
        concurrency = lambda_client.get_function_concurrency(FunctionName=name).get("ReservedConcurrentExecutions")
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"reading the function {name!r}") from exc
    env: dict[str, str] = dict((config.get("Environment") or {}).get("Variables") or {})
    target = FunctionTarget(
        name=config.get("FunctionName", name),
        timeout=float(config.get("Timeout", 3)),
        role_arn=config.get("Role"),
        reserved_concurrency=concurrency,
        memory_mb=int(config.get("MemorySize", 256)),
        environment=env,
    )
    return {"handler": config.get("Handler", ""), "service": env.get("POWERTOOLS_SERVICE_NAME", ""), "target": target}


def _deployed_env(functions: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The deployed settings' variables: the first requeue function's environment, the tier timer's over it."""
    env: dict[str, str] = {}
    for handler in (REQUEUE_HANDLER, TIMER_HANDLER):
        for f in functions:
            if f["handler"] == handler:
                env.update({k: v for k, v in f["target"].environment.items() if k.startswith("DELAYED_DELIVERY_")})
                break
    env.pop("DELAYED_DELIVERY_ERROR_QUEUE", None)  # one per endpoint, not a stack-wide setting
    return env


def _endpoint(name: str, requeue: Mapping[str, Mapping[str, Any]]) -> EndpointTarget:
    """An endpoint and its requeue function (found by its service name ``delayed-delivery-<queue>``)."""
    found = requeue.get(_SERVICE_PREFIX + name)
    if found is None:
        return EndpointTarget(name, "", FunctionTarget("", REQUEUE_TIMEOUT))
    function: FunctionTarget = found["target"]
    return EndpointTarget(name, function.environment.get("DELAYED_DELIVERY_ERROR_QUEUE", ""), function)


def _tier(
    outputs: Mapping[str, str],
    functions: Sequence[Mapping[str, Any]],
    resources: Mapping[str, Sequence[str]],
    deployed: Mapping[str, str],
) -> TierTarget | None:
    """The tier when the stack deployed it (the ``BucketName`` output), with its functions and schedule."""
    bucket = outputs.get("BucketName")
    if not bucket:
        return None
    by_handler = {f["handler"]: f["target"] for f in functions}
    timer: FunctionTarget = by_handler.get(TIMER_HANDLER) or FunctionTarget("", TIMER_TIMEOUT)
    ingest: FunctionTarget = by_handler.get(INGEST_HANDLER) or FunctionTarget("", INGEST_TIMEOUT)
    env = timer.environment
    settings = DelayedDeliverySettings.from_env(deployed)
    config = BucketTierConfig(
        bucket_name=bucket,
        prefix=env.get("DELAYED_DELIVERY_BUCKET_PREFIX") or DEFAULT_PREFIX,
        settings=replace(settings, error_queue=env.get("DELAYED_DELIVERY_ERROR_QUEUE") or settings.error_queue),
        sqs_settings=SqsSettings.from_env(deployed),
        tier_settings=TierSettings.from_env(deployed),
        cancellation_table=env.get("DELAYED_DELIVERY_CANCELLATION_TABLE") or None,
    )
    rules = list(resources.get("AWS::Events::Rule", []))
    return TierTarget(config, ingest, timer, rules[0].split("|")[-1] if rules else None)
