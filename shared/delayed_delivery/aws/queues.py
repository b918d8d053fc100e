"""Create and check an endpoint's queues: ``<queue>``, ``<queue>-delay.fifo`` and the error queue.

``ensure_endpoint`` is what tests, the demo and scripts use (the CDK construct does the same in the
cloud). ``check_endpoint`` validates a manually created FIFO queue as the NServiceBus FIFO queue rules require: delivery
delay = ``fifo_queue_delay`` (900 s), retention ≥ 4 days, no redrive policy, and explains each mismatch.
It also warns (without failing) when the queue leaves the requeue function no room to park long delays: a park
keeps 4 days of the retention free, so only a retention beyond that (14 days, the SQS maximum, is what
``ensure_endpoint`` and the CDK stack set) lets a message wait out days in parks between re-sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from ..errors import ConfigurationError, DestinationNotFoundError
from ..naming import sqs_delay_queue_name, validate_sqs_queue_name
from ..planning import MIN_PARK_HOPS, PARK_RETENTION_HEADROOM, SqsParkPolicy, sqs_park_ms
from ..settings import DelayedDeliverySettings
from .settings import SqsSettings
from .sqs import translate_error

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeNameType

__all__ = [
    "DELAY_QUEUE_VISIBILITY_SECONDS",
    "ENDPOINT_TAG",
    "MIN_RETENTION_SECONDS",
    "PARK_RETENTION_SECONDS",
    "EndpointCheck",
    "EndpointQueues",
    "check_endpoint",
    "create_queue_with",
    "ensure_endpoint",
    "longest_first_park",
    "record_endpoint",
    "recorded_endpoints",
]

#: The NServiceBus minimum message retention for a ``-delay.fifo`` queue: 4 days.
MIN_RETENTION_SECONDS = 4 * 24 * 3600
#: The retention queues are created with: 14 days, the SQS maximum, so parked messages re-send rarely.
PARK_RETENTION_SECONDS = 14 * 24 * 3600
#: ``-delay.fifo``'s visibility as the CDK stack sets it: 6x the requeue function's 30 s timeout (Lambda's advice).
DELAY_QUEUE_VISIBILITY_SECONDS = 180
#: The tag ``aws create`` puts on an endpoint's input queue and ``-delay.fifo``: the endpoint's name. On an emulator
#: (no stack to read) ``aws verify`` finds the endpoints by it, so one whose ``-delay.fifo`` was deleted is reported.
ENDPOINT_TAG = "delayed-delivery-endpoint"


@dataclass(frozen=True, slots=True)
class EndpointQueues:
    """Queue URLs of one endpoint."""

    input_url: str
    delay_url: str
    error_url: str
    delay_arn: str


def ensure_endpoint(
    client: SQSClient,
    queue: str,
    settings: DelayedDeliverySettings | None = None,
    *,
    sqs_settings: SqsSettings | None = None,
    error_queue: str | None = None,
    visibility_timeout: int = 30,
    max_message_size: int | None = None,
    delay_visibility_timeout: int | None = None,
) -> EndpointQueues:
    """Create (or reuse) the input queue, its ``-delay.fifo`` queue and the error queue; idempotent.

    ``delay_visibility_timeout`` (default ``visibility_timeout``) is the ``-delay.fifo`` queue's own: the CDK stack
    gives it 6x the requeue function's timeout (``DELAY_QUEUE_VISIBILITY_SECONDS``).
    """
    settings = settings or DelayedDeliverySettings()
    sqs_settings = sqs_settings or SqsSettings()
    validate_sqs_queue_name(queue)
    delay_name = sqs_delay_queue_name(queue)
    common: dict[QueueAttributeNameType, str] = {"VisibilityTimeout": str(visibility_timeout)}
    if max_message_size is not None:
        common["MaximumMessageSize"] = str(max_message_size)
    try:
        input_url = create_queue_with(client, queue, common)
        delay_url = create_queue_with(
            client,
            delay_name,
            {
                **common,
                "VisibilityTimeout": str(delay_visibility_timeout or visibility_timeout),
                "FifoQueue": "true",
                "DelaySeconds": str(sqs_settings.fifo_queue_delay),
                "MessageRetentionPeriod": str(PARK_RETENTION_SECONDS),
            },
        )
        error_url = create_queue_with(
            client, error_queue or settings.error_queue, {"MessageRetentionPeriod": str(14 * 24 * 3600)}
        )
        arn = client.get_queue_attributes(QueueUrl=delay_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"creating the queues of endpoint {queue!r}") from exc
    return EndpointQueues(input_url, delay_url, error_url, arn)


def record_endpoint(client: SQSClient, queue: str, queues: EndpointQueues) -> None:
    """Tag the endpoint's input queue and ``-delay.fifo`` with its name (``ENDPOINT_TAG``), as ``aws create`` does."""
    try:
        for url in (queues.input_url, queues.delay_url):
            client.tag_queue(QueueUrl=url, Tags={ENDPOINT_TAG: queue})
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"tagging the queues of endpoint {queue!r}") from exc


def recorded_endpoints(client: SQSClient) -> list[str]:
    """The endpoints ``aws create`` made here: by their queues' ``ENDPOINT_TAG`` (so an endpoint whose ``-delay.fifo``
    was deleted is still found by its input queue), and every untagged ``<q>-delay.fifo`` made before the tag."""
    found: set[str] = set()
    try:
        for page in client.get_paginator("list_queues").paginate(PaginationConfig={"PageSize": 1000}):
            for url in page.get("QueueUrls", []):
                name = url.rsplit("/", 1)[-1]
                tag = _endpoint_tag(client, url)
                if tag:
                    found.add(tag)
                elif name.endswith("-delay.fifo"):
                    found.add(name.removesuffix("-delay.fifo"))
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, "listing the queues") from exc
    return sorted(found)


def _endpoint_tag(client: SQSClient, url: str) -> str | None:
    """The queue's ``ENDPOINT_TAG`` (None when untagged, or when the queue went away since the listing)."""
    try:
        return client.list_queue_tags(QueueUrl=url).get("Tags", {}).get(ENDPOINT_TAG)
    except ClientError as exc:
        if isinstance(translate_error(exc, url), DestinationNotFoundError):
            return None
        raise


#: The setting behind an attribute ``ensure_endpoint`` sets, for the error when an existing queue differs.
_SETTING_OF = {"DelaySeconds": "DELAYED_DELIVERY_FIFO_QUEUE_DELAY"}


def create_queue_with(client: SQSClient, name: str, attributes: dict[QueueAttributeNameType, str]) -> str:
    """``create_queue``; when the queue exists with other attributes, one error naming the queue and each difference."""
    try:
        return client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("QueueAlreadyExists", "QueueNameExists"):
            raise
    url = client.get_queue_url(QueueName=name)["QueueUrl"]
    existing = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    wrong = {key: wanted for key, wanted in attributes.items() if not _same(existing.get(key), wanted)}
    differing = [
        f"{key} is {existing.get(key, 'unset')}, wanted {wanted}"
        + (f" ({_SETTING_OF[key]})" if key in _SETTING_OF else "")
        for key, wanted in wrong.items()
    ]
    fix = f"aws sqs set-queue-attributes --queue-url {url} --attributes '{json.dumps(wrong)}'"
    raise ConfigurationError(
        f"queue {name!r} already exists with other attributes: {'; '.join(differing) or 'SQS did not say which'}. "
        f"Set them back ({fix if wrong else 'aws sqs set-queue-attributes'}), or run with the settings it was made "
        "with"
    )


def _same(existing: str | None, wanted: str) -> bool:
    """An attribute as SQS returns it against the value asked for (a JSON policy compared as data, not as text)."""
    if existing == wanted:
        return True
    try:
        return existing is not None and json.loads(existing) == json.loads(wanted)
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class EndpointCheck:
    """Findings for one endpoint; ``problems`` empty means the FIFO queue rules hold (``warnings`` do not fail)."""

    queue: str
    delay_queue: str
    problems: tuple[str, ...]
    facts: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems


def check_endpoint(client: SQSClient, queue: str, settings: SqsSettings | None = None) -> EndpointCheck:
    """Check ``queue`` (an input queue or its ``-delay.fifo``) against the FIFO queue rules."""
    settings = settings or SqsSettings()
    input_name = queue.removesuffix("-delay.fifo") if queue.endswith("-delay.fifo") else queue
    delay_name = sqs_delay_queue_name(input_name)
    problems: list[str] = []
    facts: list[str] = []
    for name in (input_name,):
        try:
            client.get_queue_url(QueueName=name)
            facts.append(f"input queue {name!r} exists")
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, name)
            if not isinstance(error, DestinationNotFoundError):
                raise error from exc
            problems.append(f"input queue {name!r} does not exist: create it, or check the name and region")
    try:
        url = client.get_queue_url(QueueName=delay_name)["QueueUrl"]
        attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    except (ClientError, BotoCoreError) as exc:
        error = translate_error(exc, delay_name)
        if not isinstance(error, DestinationNotFoundError):
            raise error from exc
        problems.append(
            f"delay queue {delay_name!r} does not exist: create a FIFO queue with that name, DelaySeconds="
            f"{settings.fifo_queue_delay}, MessageRetentionPeriod>={MIN_RETENTION_SECONDS} and no redrive policy "
            "(or deploy infra/aws)"
        )
        return EndpointCheck(input_name, delay_name, tuple(problems), tuple(facts))
    delay = int(attrs.get("DelaySeconds", "0"))
    retention = int(attrs.get("MessageRetentionPeriod", "0"))
    if attrs.get("FifoQueue", "false").lower() != "true":
        problems.append(f"{delay_name!r} is not a FIFO queue")
    if delay != settings.fifo_queue_delay:
        problems.append(
            f"DelaySeconds is {delay} s but must be {settings.fifo_queue_delay} s: each hop waits exactly this long "
            f"(set it with set-queue-attributes DelaySeconds={settings.fifo_queue_delay})"
        )
    else:
        facts.append(f"DelaySeconds {delay} s")
    if retention < MIN_RETENTION_SECONDS:
        problems.append(
            f"MessageRetentionPeriod is {retention} s but must be at least {MIN_RETENTION_SECONDS} s (4 days), "
            "so a hop held up by an outage is not lost"
        )
    else:
        facts.append(f"MessageRetentionPeriod {retention} s")
    warnings = _parking_warnings(retention, int(attrs.get("VisibilityTimeout", "30")), settings)
    if attrs.get("RedrivePolicy"):
        target = json.loads(attrs["RedrivePolicy"]).get("deadLetterTargetArn", "?")
        problems.append(
            f"a RedrivePolicy (to {target}) is configured: remove it; a delayed message must never be moved to a "
            "dead-letter queue by receive count, the requeue function sends poison records to the error queue itself"
        )
    else:
        facts.append("no redrive policy")
    return EndpointCheck(input_name, delay_name, tuple(problems), tuple(facts), warnings)


def longest_first_park(retention: int, visibility_timeout: int, settings: SqsSettings) -> int:
    """Seconds a very long delay parks on its first receive on such a queue (0: it never parks there)."""
    policy = SqsParkPolicy(
        fifo_queue_delay=settings.fifo_queue_delay,
        max_native_delay=settings.max_native_delay,
        max_park_seconds=settings.max_park_seconds,
        retention_seconds=retention,
        visibility_timeout=visibility_timeout,
    )
    return sqs_park_ms(10**15, settings.fifo_queue_delay * 1000, policy) // 1000


def _parking_warnings(retention: int, visibility_timeout: int, settings: SqsSettings) -> tuple[str, ...]:
    """Why the requeue function cannot park (much) on this queue; nothing when parking is off or has room."""
    if settings.max_park_seconds <= 0:
        return ()
    if not longest_first_park(retention, visibility_timeout, settings):
        return (
            f"parking never happens here: a park keeps {PARK_RETENTION_HEADROOM} s (4 days) of the retention free "
            f"for outages and must last at least {MIN_PARK_HOPS} hops and twice (visibility timeout + hop), but "
            f"MessageRetentionPeriod is {retention} s and VisibilityTimeout {visibility_timeout} s; long delays "
            f"hop every {settings.fifo_queue_delay} s instead (set MessageRetentionPeriod={PARK_RETENTION_SECONDS})",
        )
    if retention < PARK_RETENTION_SECONDS:
        room, best = retention - PARK_RETENTION_HEADROOM, PARK_RETENTION_SECONDS - PARK_RETENTION_HEADROOM
        return (
            f"MessageRetentionPeriod is {retention} s: a parked message must be re-sent every {room:,} s or so "
            f"(the retention minus the 4 days kept free), not every {best:,} s "
            f"(set MessageRetentionPeriod={PARK_RETENTION_SECONDS}, the SQS maximum)",
        )
    return ()
