"""Cloud routes for the operator commands: SQS (delayed sender, queue attributes) and the Azure delays table.

Cloud SDKs are imported inside the routes, so ``delayed-delivery`` runs without the extras until a route is used.

Fixed local defaults (``--local``, and what ``delayed-delivery local up`` starts):

* SQS: moto server at ``http://127.0.0.1:5000``, region ``us-east-1``, credentials ``testing``.
* Azure: Azurite's standard ports 10000 (blob), 10001 (queue), 10002 (table) with the development account,
  i.e. what ``UseDevelopmentStorage=true`` means (the Python SDK does not expand that shortcut; this module does).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from delayed_delivery.app.emulators import azurite_connection_string
from delayed_delivery.clock import SystemClock, utc
from delayed_delivery.errors import ConfigurationError, DestinationNotFoundError, InvalidMessageError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeNameType

    from delayed_delivery.aws.cancellations import DynamoDbCancellationStore

__all__ = [
    "LOCAL_AZURITE_PORTS",
    "LOCAL_MOTO_URL",
    "LOCAL_REGION",
    "AzureTableRoute",
    "CloudOptions",
    "SqsRoute",
    "local_azure_connection_string",
    "open_cloud_route",
]

LOCAL_MOTO_PORT = 5000
LOCAL_MOTO_URL = f"http://127.0.0.1:{LOCAL_MOTO_PORT}"
LOCAL_REGION = "us-east-1"
#: Azurite's standard ports: blob, queue, table.
LOCAL_AZURITE_PORTS = (10000, 10001, 10002)
_DEV_STORAGE = "usedevelopmentstorage=true"


def local_azure_connection_string() -> str:
    """The connection string ``UseDevelopmentStorage=true`` stands for (Azurite on 10000-10002)."""
    return azurite_connection_string(*LOCAL_AZURITE_PORTS)


@dataclass(frozen=True, slots=True)
class CloudOptions:
    """Connection options from flags or the environment."""

    cloud: str
    local: bool = False
    endpoint_url: str | None = None
    region: str | None = None
    connection_string: str | None = None
    endpoint: str = ""


def _seconds_until(due: datetime) -> float:
    return max(0.0, (utc(due) - SystemClock().now()).total_seconds())


# ------------------------------------------------------------------------------------------------ SQS


class SqsRoute:
    """Send through ``SqsDelayedSender``; pending from queue attributes; cancel / reschedule by record on the cycle."""

    name = "aws"

    def __init__(self, options: CloudOptions) -> None:
        import boto3

        from delayed_delivery.settings import DelayedDeliverySettings

        endpoint_url = options.endpoint_url or (LOCAL_MOTO_URL if options.local else None)
        region = options.region or (LOCAL_REGION if options.local else None)
        key = "testing" if options.local and not os.environ.get("AWS_ACCESS_KEY_ID") else None
        self.where = endpoint_url or "AWS"
        self.client: SQSClient = boto3.client(
            "sqs", endpoint_url=endpoint_url, region_name=region, aws_access_key_id=key, aws_secret_access_key=key
        )
        self.settings = DelayedDeliverySettings.from_env(os.environ)
        # moto serves DynamoDB on the SQS port; AWS_ENDPOINT_URL_DYNAMODB splits them.
        self.dynamodb: DynamoDBClient = boto3.client(
            "dynamodb",
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or endpoint_url,
            region_name=region,
            aws_access_key_id=key,
            aws_secret_access_key=key,
        )

    def send(
        self, to: str, body: bytes, due: datetime, headers: dict[str, str], message_id: str | None
    ) -> dict[str, Any]:
        """Send with the delayed sender: native ``DelaySeconds`` up to the cap, else the ``-delay.fifo`` hops."""
        from delayed_delivery.aws.sender import SqsDelayedSender

        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidMessageError(
                "an SQS body is text: the body is not UTF-8 (base64-encode binary data)"
            ) from None
        seconds = math.ceil(_seconds_until(due))
        receipt = SqsDelayedSender(self.client, self.settings).send_delayed(
            to, text, seconds, attributes=dict(headers), message_id=message_id
        )
        return {
            "message_id": receipt.message_id,
            "cloud": "aws",
            "route": f"sqs-{receipt.route.value}",
            "queue": receipt.queue,
            "destination": to,
            "delay_seconds": receipt.delay_seconds,
            "fifo_cycles": receipt.fifo_cycles,
            "due_at": (SystemClock().now() + timedelta(seconds=seconds)).isoformat(),
        }

    def pending(self, queue: str | None) -> dict[str, Any]:
        """Approximate counts from queue attributes of every endpoint (``<q>`` with ``<q>-delay.fifo``)."""
        from botocore.exceptions import BotoCoreError, ClientError

        from delayed_delivery.aws.sqs import translate_error

        try:
            if queue is not None:
                names = [queue.removesuffix("-delay.fifo")]
                urls = {}
                for name in (*names, f"{names[0]}-delay.fifo"):
                    urls[name] = self.client.get_queue_url(QueueName=name)["QueueUrl"]
            else:
                listed = self.client.list_queues(MaxResults=1000).get("QueueUrls", [])
                urls = {u.rsplit("/", 1)[-1]: u for u in listed}
                names = sorted(n.removesuffix("-delay.fifo") for n in urls if n.endswith("-delay.fifo"))
            wanted: list[QueueAttributeNameType] = [
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesDelayed",
                "ApproximateNumberOfMessagesNotVisible",
            ]
            rows: list[dict[str, Any]] = []
            for name in names:
                delay_name = f"{name}-delay.fifo"
                fifo = self.client.get_queue_attributes(QueueUrl=urls[delay_name], AttributeNames=wanted)["Attributes"]
                dest = (
                    self.client.get_queue_attributes(QueueUrl=urls[name], AttributeNames=wanted)["Attributes"]
                    if name in urls
                    else {}
                )
                rows.append(
                    {
                        "queue": name,
                        "hop_cycle": sum(int(fifo.get(k, 0)) for k in wanted),
                        "final_native_delay": int(dest.get("ApproximateNumberOfMessagesDelayed", 0)),
                        "ready_at_destination": int(dest.get("ApproximateNumberOfMessages", 0)),
                    }
                )
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, f"reading queue attributes at {self.where}") from exc
        return {
            "cloud": "aws",
            "route": "sqs-queue-attributes",
            "pending": sum(r["hop_cycle"] + r["final_native_delay"] for r in rows),
            "queues": rows,
            "error_queue": self.settings.error_queue,
            "error_queue_messages": self._error_queue_depth(),
            "limits": (
                "SQS counts are approximate (eventually consistent) and carry no due times: no backlog by hour/day, "
                "no next due or overdue. 'hop cycle' = messages in <queue>-delay.fifo (delays beyond the native cap); "
                "'final native delay' = messages waiting out DelaySeconds on the destination (they may also be "
                "directly sent short delays)."
            ),
        }

    def _error_queue_depth(self) -> int | None:
        """Messages waiting in the error queue (None when it does not exist)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            url = self.client.get_queue_url(QueueName=self.settings.error_queue)["QueueUrl"]
            attrs = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        except (ClientError, BotoCoreError):
            return None
        return int(attrs["Attributes"].get("ApproximateNumberOfMessages", 0))

    def _records(self, to: str) -> DynamoDbCancellationStore:
        """The cancellation table, after checking that ``to`` has a hop cycle and the table exists."""
        from botocore.exceptions import BotoCoreError, ClientError

        from delayed_delivery.aws.cancellations import DEFAULT_TABLE, TABLE_ENV, DynamoDbCancellationStore
        from delayed_delivery.aws.sqs import translate_error
        from delayed_delivery.naming import sqs_delay_queue_name

        delay_queue = sqs_delay_queue_name(to)
        try:
            self.client.get_queue_url(QueueName=delay_queue)
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, f"looking up {delay_queue!r} at {self.where}")
            if isinstance(error, DestinationNotFoundError):
                raise DestinationNotFoundError(
                    f"unknown queue {to!r}: it has no {delay_queue!r} at {self.where}, so no message of it is on the "
                    "hop cycle (check --to)"
                ) from exc
            raise error from exc
        store = DynamoDbCancellationStore(self.dynamodb, os.environ.get(TABLE_ENV, "").strip() or DEFAULT_TABLE)
        store.check()
        return store

    def _reach(self) -> tuple[float, str]:
        """Seconds before its due time a message leaves the cycle (cap + record cache), and how to say it."""
        from delayed_delivery.aws.cancellations import cache_seconds_from_env
        from delayed_delivery.durations import format_duration

        cache = cache_seconds_from_env(os.environ)
        reach = self.settings.max_native_delay + cache
        return cache, (
            f"{format_duration(reach)} ({format_duration(self.settings.max_native_delay)} native cap + "
            f"{format_duration(cache)} record cache)"
        )

    def cancel(self, message_id: str, *, to: str, due: datetime | None = None) -> dict[str, Any]:
        """Write a cancel record for ``message_id`` on ``to``'s hop cycle; refused when ``due`` is too near."""
        from delayed_delivery.cancellations import cancel_request

        store = self._records(to)
        cache, reach = self._reach()
        record = cancel_request(
            to,
            message_id,
            now=SystemClock().now(),
            max_native_delay=self.settings.max_native_delay,
            max_age=cache,
            due=due,
        )
        store.put(record)
        if due is not None:
            note = f"it is dropped at its next hop, well before its due time {utc(due).isoformat()}"
        else:
            note = (
                f"it is dropped at its next hop unless it is due within {reach}: then it already waits out its "
                f"final native delay on {to!r} and is delivered (give --due to know for sure)"
            )
        return {
            "message_id": message_id,
            "route": "aws",
            "queue": to,
            "requested": "cancel",
            "certain": due is not None,
            "table": store.table,
            "record_expires_at": record.expires_at.isoformat(),
            "note": note,
        }

    def reschedule(self, message_id: str, due: datetime, *, to: str) -> dict[str, Any]:
        """Write a reschedule record: ``message_id`` moves to ``due`` at its next hop on ``to``'s cycle."""
        from delayed_delivery.cancellations import reschedule_request
        from delayed_delivery.durations import format_duration

        store = self._records(to)
        _, reach = self._reach()
        record = reschedule_request(to, message_id, due, now=SystemClock().now())
        store.put(record)
        return {
            "message_id": message_id,
            "route": "aws",
            "queue": to,
            "requested": "reschedule",
            "due_at": utc(due).isoformat(),
            "table": store.table,
            "record_expires_at": record.expires_at.isoformat(),
            "note": (
                f"it moves at its next hop (every {format_duration(self.settings.fifo_queue_delay)}), unless it is "
                f"already due within {reach}; a new due time sooner than that hop is met at the hop"
            ),
        }


# ------------------------------------------------------------------------------------------------ Azure


class AzureTableRoute:
    """Send through ``AzureDelayedSender``; pending, cancel and reschedule exactly on the endpoint's delays table."""

    name = "azure"

    def __init__(self, options: CloudOptions) -> None:
        from delayed_delivery.azure.config import ENV_CONNECTION, ENV_ENDPOINT, AzureClients, AzureDelayedDeliveryConfig
        from delayed_delivery.azure.table_store import TableDelayedMessageStore

        env = dict(os.environ)
        env[ENV_ENDPOINT] = options.endpoint
        connection = options.connection_string
        if connection and connection.strip().rstrip(";").lower() == _DEV_STORAGE:
            connection = local_azure_connection_string()
        if options.local and not connection:
            connection = local_azure_connection_string()
        if connection:
            env[ENV_CONNECTION] = connection
        if not connection and not env.get("DELAYED_DELIVERY_STORAGE_ACCOUNT") and not env.get("AzureWebJobsStorage"):
            raise ConfigurationError(
                "no storage account: give --connection-string (env DELAYED_DELIVERY_STORAGE_CONNECTION_STRING), "
                "set DELAYED_DELIVERY_STORAGE_ACCOUNT, or use --local for Azurite on 10000-10002"
            )
        self.endpoint = options.endpoint
        self.config = AzureDelayedDeliveryConfig.from_env(env)
        self.clients = AzureClients.create(self.config)
        self.store = TableDelayedMessageStore(
            self.clients.tables.get_table_client(self.config.table_name),
            shards=self.config.shards,
            claim_timeout=self.config.claim_timeout,
        )

    def _check_queue(self, name: str) -> None:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        from delayed_delivery.azure.sdk_errors import translate
        from delayed_delivery.naming import validate_azure_queue_name

        validate_azure_queue_name(name)
        try:
            self.clients.queues.get_queue_client(name).get_queue_properties()
        except ResourceNotFoundError:
            raise DestinationNotFoundError(
                f"unknown queue {name!r}: it does not exist in this storage account"
            ) from None
        except AzureError as exc:
            raise translate(exc, f"checking queue {name!r}") from exc

    def _check_table(self) -> None:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        from delayed_delivery.azure.sdk_errors import translate

        try:
            self.clients.tables.get_table_client(self.config.table_name).get_table_access_policy()
        except ResourceNotFoundError:
            raise ConfigurationError(self._no_table()) from None
        except AzureError as exc:
            raise translate(exc, f"checking table {self.config.table_name!r}") from exc

    def _no_table(self) -> str:
        return (
            f"delays table {self.config.table_name!r} of endpoint {self.endpoint!r} does not exist: check --endpoint, "
            "or create it with `delayed-delivery azure setup`"
        )

    def send(
        self,
        to: str,
        body: bytes,
        due: datetime,
        headers: dict[str, str],
        message_id: str | None,
        *,
        cancellable: bool = False,
    ) -> dict[str, Any]:
        """Native visibility timeout up to 7 days (unless ``cancellable``), else a row in the delays table."""
        from delayed_delivery.azure.sender import AzureDelayedSender
        from delayed_delivery.azure.storage_queue import MAX_NATIVE_DELAY_SECONDS, StorageQueueTransport

        self._check_queue(to)
        if cancellable or _seconds_until(due) > MAX_NATIVE_DELAY_SECONDS:
            self._check_table()  # the table route: say which table is missing before anything is written
        sender = AzureDelayedSender(StorageQueueTransport(self.clients.queues), self.store, self.config.settings)
        result = sender.send(to, body, at=due, headers=headers, message_id=message_id, cancellable=cancellable)
        return {
            "message_id": result.message_id,
            "cloud": "azure",
            "route": f"azure-{result.route}",
            "destination": to,
            "table": self.config.table_name if result.route == "table" else None,
            "due_at": result.due_at.isoformat(),
        }

    def pending(self, bucket_seconds: int) -> dict[str, Any]:
        """Exact: every due row of the delays table, bucketed by due time (reads the due rows' keys only)."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        from delayed_delivery.azure import rows
        from delayed_delivery.azure.sdk_errors import translate

        now = SystemClock().now()
        buckets: Counter[datetime] = Counter()
        earliest: datetime | None = None
        total = claimed = 0
        table = self.clients.tables.get_table_client(self.config.table_name)
        try:
            for entity in table.query_entities(
                "RowKey ge @lo and RowKey lt @hi",
                parameters={"lo": rows.DUE_PREFIX, "hi": rows.DUE_END},
                select=["RowKey", "AvailableAt"],
                results_per_page=1000,
            ):
                key = str(entity["RowKey"])[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20]
                due = rows.from_due_key(key)
                total += 1
                if str(entity.get("AvailableAt", key)) > key:
                    claimed += 1
                earliest = due if earliest is None or due < earliest else earliest
                start = datetime.fromtimestamp(due.timestamp() // bucket_seconds * bucket_seconds, tz=due.tzinfo)
                buckets[start] += 1
        except ResourceNotFoundError:
            raise ConfigurationError(self._no_table()) from None
        except AzureError as exc:
            raise translate(exc, f"reading table {self.config.table_name!r}") from exc
        overdue = (now - earliest).total_seconds() if earliest is not None and earliest <= now else 0.0
        return {
            "cloud": "azure",
            "route": "azure-table",
            "table": self.config.table_name,
            "pending": total,
            "claimed_or_retrying": claimed,
            "next_due": earliest.isoformat() if earliest else None,
            "oldest_overdue_seconds": overdue,
            "backlog": [{"bucket": b.isoformat(), "count": n} for b, n in sorted(buckets.items())],
            "error_queue": self.config.settings.error_queue,
            "error_queue_messages": self._error_queue_depth(),
            "limits": "table-routed messages only; native ones (≤ 7 days, not cancellable) wait in their queue, "
            "invisible, and are not counted here",
        }

    def _error_queue_depth(self) -> int | None:
        """Approximate messages in the error queue (None when it does not exist or cannot be read)."""
        from azure.core.exceptions import AzureError

        try:
            properties = self.clients.queues.get_queue_client(self.config.settings.error_queue).get_queue_properties()
        except AzureError:
            return None
        return int(properties.approximate_message_count or 0)

    def cancel(self, message_id: str) -> bool:
        """Delete the message's rows (exact)."""
        self._check_table()
        return self.store.remove(message_id)

    def reschedule(self, message_id: str, due: datetime) -> bool:
        """Move the message's due row (exact, one transaction)."""
        self._check_table()
        return self.store.reschedule(message_id, due)


def open_cloud_route(options: CloudOptions) -> SqsRoute | AzureTableRoute:
    """The route for ``options.cloud`` (``aws`` or ``azure``)."""
    if options.cloud == "aws":
        try:
            return SqsRoute(options)
        except ImportError as exc:
            raise ConfigurationError("the aws route needs the aws extra: pip install 'delayed-delivery[aws]'") from exc
    if options.cloud == "azure":
        try:
            return AzureTableRoute(options)
        except ImportError as exc:
            raise ConfigurationError(
                "the azure route needs the azure extra: pip install 'delayed-delivery[azure]'"
            ) from exc
    raise ConfigurationError(f"unknown cloud {options.cloud!r}: use aws or azure")
