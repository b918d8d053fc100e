"""The fixed inputs of the golden files, a JSON codec for bytes, and the capture of what the writers send.

The constants here are part of the goldens: never edit them (add new ones beside them for a new version).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

GOLDEN = Path(__file__).resolve().parent

#: The broker's send time of every SQS record built from a golden (2030-01-01T00:00:00Z), in epoch ms.
SENT_MS = 1_893_456_000_000
ACCOUNT = "123456789012"
DELAY_ARN = f"arn:aws:sqs:us-east-1:{ACCOUNT}:orders-delay.fifo"

MESSAGE_ID = "golden-order-1"
DESTINATION = "orders"
#: Non-ASCII text: SQS bodies are text, the stores keep bytes.
BODY = '{"order":42,"note":"café ☕","lines":[1,2,3]}'
#: Three days: the FIFO route.
LONG_DELAY = 259_200
#: A string, a binary, a number and a custom-typed attribute (nine user attributes at most on the FIFO route).
ATTRIBUTES: dict[str, Any] = {
    "kind": "order",
    "trace": b"\x00\x01\xfe\xff golden",
    "priority": 7,
    "schema": {"DataType": "String.json", "StringValue": '{"v":2}'},
}
#: Three messages a batch packs into one envelope.
BATCH = (
    ("golden-batch-a", "first", {"kind": "a", "blob": b"\x10\x20\x30"}),
    ("golden-batch-b", "second ✓", {"kind": "b"}),
    ("golden-batch-c", "third", {}),
)

#: The S3 time-bucket tier's ingest queue (sqs_ingest).
INGEST_QUEUE = "delayed-delivery-ingest"

#: The store messages (Azure queue, Azure table, SQL rows).
STORE_ID = "golden-stored-1"
STORE_DESTINATION = "orders"
STORE_BODY = "héllo wörld ✓ \x00\x01\x02".encode()
STORE_HEADERS = {"kind": "order", "trace-id": "0af7651916cd43dd8448eb211c80319c", "note": "café ☕"}
STORE_DUE = datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
STORE_FAILURES = 2
#: A body over 64 KiB: the table row splits it into two chunks.
BIG_BODY = bytes(range(256)) * 300
BIG_ID = "golden-stored-big"
TABLE_SHARDS = 16
#: The release slot the deferred-row golden keeps the store message back until (Azure table).
DEFERRED_SLOT = datetime(2031, 3, 5, 6, 7, 8, 123456, tzinfo=UTC)
#: A connection string that builds clients without reaching anything (writers that need a client object).
OFFLINE_ACCOUNT = "UseDevelopmentStorage=true"
#: The queue message id and pop receipt the placed-row golden records (Azure table, placed ahead).
PLACED_QUEUE_MESSAGE_ID = "7c1c2a4e-3f0b-4a59-9d0e-2b8f1f0c5e11"
PLACED_POP_RECEIPT = "AgAAAAMAAAAAAAAAGoVjb0YO3QE="


def encode(value: Any) -> Any:
    """A JSON-able copy of ``value``: bytes become ``{"$base64": ...}``."""
    if isinstance(value, bytes | bytearray):
        return {"$base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    """Inverse of ``encode``."""
    if isinstance(value, dict):
        if set(value) == {"$base64"}:
            return base64.b64decode(value["$base64"])
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """The text of a golden file."""
    return json.dumps(encode(value), indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def version_of(name: str) -> int:
    """``sqs_send.v12.json`` → 12."""
    return int(name.rsplit(".v", 1)[1].split(".", 1)[0])


def versions(kind: str) -> list[str]:
    """The golden files of ``kind`` (e.g. ``"sqs_send"``), oldest first."""
    return sorted((p.name for p in GOLDEN.glob(f"{kind}.v*.json")), key=version_of)


def load(name: str) -> Any:
    """A golden file, bytes decoded."""
    return decode(json.loads((GOLDEN / name).read_text(encoding="utf-8")))


def record_calls(client: SQSClient) -> list[dict[str, Any]]:
    """Every SendMessage / SendMessageBatch / ChangeMessageVisibility request ``client`` makes, as sent.

    ``QueueUrl`` is replaced by ``Queue`` (the queue name), so the capture does not depend on the endpoint.
    """
    calls: list[dict[str, Any]] = []

    def hook(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name.startswith(("SendMessage", "ChangeMessageVisibility")):
            call = copy.deepcopy(params)
            call["Queue"] = str(call.pop("QueueUrl")).rsplit("/", 1)[-1]
            calls.append({"Operation": model.name, **call})

    client.meta.events.register("provide-client-params.sqs.*", hook)
    return calls


def lambda_record(
    request: Mapping[str, Any],
    *,
    record_id: str,
    first_receive_ms: int,
    sent_ms: int = SENT_MS,
    receive_count: int = 1,
    source_arn: str = DELAY_ARN,
) -> dict[str, Any]:
    """The SQS event record Lambda hands the requeue function for a message sent with ``request``."""
    attributes: dict[str, Any] = {}
    for name, value in (request.get("MessageAttributes") or {}).items():
        if "BinaryValue" in value:
            data = base64.b64encode(bytes(value["BinaryValue"])).decode("ascii")
            attributes[name] = {"dataType": value["DataType"], "binaryValue": data, "binaryListValues": []}
        else:
            attributes[name] = {"dataType": value["DataType"], "stringValue": value["StringValue"]}
    return {
        "messageId": record_id,
        "receiptHandle": f"handle-{record_id}",
        "body": request["MessageBody"],
        "attributes": {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": str(sent_ms),
            "SenderId": ACCOUNT,
            "ApproximateFirstReceiveTimestamp": str(first_receive_ms),
            "MessageGroupId": request["MessageGroupId"],
            "MessageDeduplicationId": request["MessageDeduplicationId"],
            "SequenceNumber": "18849496460467696128",
        },
        "messageAttributes": attributes,
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": source_arn,
        "awsRegion": "us-east-1",
    }


def create_queues(client: SQSClient) -> None:
    """``orders``, ``orders-delay.fifo`` (FIFO queue rules) and ``error`` on the emulator."""
    client.create_queue(QueueName=DESTINATION)
    client.create_queue(QueueName="error")
    client.create_queue(
        QueueName=f"{DESTINATION}-delay.fifo",
        Attributes={"FifoQueue": "true", "DelaySeconds": "900", "MessageRetentionPeriod": "1209600"},
    )
