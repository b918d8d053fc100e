"""Run today's writers on the fixed inputs of ``wire.py`` and return what they put on the wire or in a row."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayed_delivery.aws.requeue import FifoRequeuer
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.azure.layout import layout_entity
from delayed_delivery.azure.rows import (
    deferred_entities,
    due_key,
    placed_patch,
    placing_mark,
    sending_mark,
    shard_of,
    to_entities,
)
from delayed_delivery.azure.storage_queue import encode_envelope
from delayed_delivery.clock import ManualClock
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore
from tests.golden import wire

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

#: The first receive of a record sent at ``SENT_MS``: one FIFO hop (900 s) and 1.234 s later.
FIRST_MS = wire.SENT_MS + 901_234


def requeuer(client: SQSClient, now_ms: int) -> FifoRequeuer:
    """The requeue step with its clock at ``now_ms`` and parking off (every record hops, forwards or fails)."""
    clock = ManualClock(datetime.fromtimestamp(now_ms / 1000, UTC))
    return FifoRequeuer(client, sqs_settings=SqsSettings(max_park_seconds=0), clock=clock)


def sqs_send(client: SQSClient) -> dict[str, Any]:
    """``send_delayed`` of a long delay (the ``-delay.fifo`` route) and of a short one (native)."""
    wire.create_queues(client)
    calls = wire.record_calls(client)
    sender = SqsDelayedSender(client, clock=ManualClock(datetime.fromtimestamp(wire.SENT_MS / 1000, UTC)))
    sender.send_delayed(
        wire.DESTINATION, wire.BODY, wire.LONG_DELAY, attributes=wire.ATTRIBUTES, message_id=wire.MESSAGE_ID
    )
    sender.send_delayed(wire.DESTINATION, wire.BODY, 600, attributes=wire.ATTRIBUTES, message_id="golden-native-1")
    fifo, native = calls
    return {"fifo": fifo, "native": native}


def sqs_requeue(client: SQSClient) -> dict[str, Any]:
    """What the requeue step sends after one hop (back to the FIFO queue) and on the last one (to the destination)."""
    fifo = sqs_send(client)["fifo"]
    calls = wire.record_calls(client)
    record = wire.lambda_record(fifo, record_id="rec-hop-0", first_receive_ms=FIRST_MS)
    requeuer(client, FIRST_MS + 50).process([record])
    [hop] = calls
    # The hop's message comes back with 300.25 s left: it is forwarded with DelaySeconds rounded up.
    entry = hop["Entries"][0]
    sent = FIRST_MS + 20
    first = sent + 258_298_766 - 300_250
    last = wire.lambda_record(entry, record_id="rec-hop-1", sent_ms=sent, first_receive_ms=first)
    requeuer(client, first + 50).process([last])
    forward = calls[1]
    return {"hop": hop, "forward": forward}


def sqs_envelope(client: SQSClient) -> dict[str, Any]:
    """A batch packed into an envelope by the sender, and the envelope the requeue step re-packs after a hop."""
    wire.create_queues(client)
    calls = wire.record_calls(client)
    sender = SqsDelayedSender(client)
    batch = [DelayedSend(wire.DESTINATION, body, wire.LONG_DELAY, attrs, mid) for mid, body, attrs in wire.BATCH]
    sender.send_delayed_batch(batch).raise_for_failures()
    [sent] = calls
    [entry] = sent["Entries"]
    record = wire.lambda_record(entry, record_id="rec-envelope-0", first_receive_ms=FIRST_MS)
    requeuer(client, FIRST_MS + 50).process([record])
    return {"sent": sent, "requeued": calls[1]}


def sqs_ingest(client: SQSClient) -> dict[str, Any]:
    """The bucket route (#17): one message and a batch sent to the tier's ingest queue in ingest envelopes."""
    wire.create_queues(client)
    client.create_queue(QueueName=wire.INGEST_QUEUE)
    calls = wire.record_calls(client)
    routing = SqsSettings(long_delay_route="buckets", bucket_ingest_queue=wire.INGEST_QUEUE)
    clock = ManualClock(datetime.fromtimestamp(wire.SENT_MS / 1000, UTC))
    sender = SqsDelayedSender(client, DelayedDeliverySettings(), sqs_settings=routing, clock=clock)
    sender.send_delayed(
        wire.DESTINATION, wire.BODY, wire.LONG_DELAY, attributes=wire.ATTRIBUTES, message_id=wire.MESSAGE_ID
    )
    batch = [DelayedSend(wire.DESTINATION, body, wire.LONG_DELAY, attrs, mid) for mid, body, attrs in wire.BATCH]
    sender.send_delayed_batch(batch).raise_for_failures()
    single, packed = calls
    return {"single": single, "batch": packed}


def sqs_error_queue(client: SQSClient) -> dict[str, Any]:
    """A FIFO record without its control attribute, sent to the error queue with the reason attributes."""
    fifo = sqs_send(client)["fifo"]
    calls = wire.record_calls(client)
    broken = {**fifo, "MessageAttributes": dict(fifo["MessageAttributes"])}
    del broken["MessageAttributes"][DELAY_SECONDS_ATTRIBUTE]
    record = wire.lambda_record(broken, record_id="rec-poison-0", first_receive_ms=FIRST_MS)
    requeuer(client, FIRST_MS + 50).process([record])
    [error] = calls
    return {"error": error}


def store_message(*, big: bool = False) -> DelayedMessage:
    """The message of the store goldens (``big``: a body over 64 KiB)."""
    if big:
        return DelayedMessage(wire.BIG_ID, wire.STORE_DESTINATION, wire.BIG_BODY, wire.STORE_DUE, wire.STORE_HEADERS)
    return DelayedMessage(
        wire.STORE_ID, wire.STORE_DESTINATION, wire.STORE_BODY, wire.STORE_DUE, wire.STORE_HEADERS, wire.STORE_FAILURES
    )


def azure_queue() -> dict[str, Any]:
    """The Storage Queue message text for the store message."""
    return {"text": encode_envelope(store_message())}


def azure_table() -> dict[str, Any]:
    """The due and index entities of the store message and of a message with a chunked body."""
    rows = []
    for message in (store_message(), store_message(big=True)):
        due, index = to_entities(message, shard_of(message.message_id, wire.TABLE_SHARDS))
        rows.append({"due": due, "index": index})
    return {"shards": wire.TABLE_SHARDS, "rows": rows}


def azure_table_deferred() -> dict[str, Any]:
    """The rows of the store message that release control keeps back until ``wire.DEFERRED_SLOT``."""
    message = store_message()
    due, index = deferred_entities(message, shard_of(message.message_id, wire.TABLE_SHARDS), wire.DEFERRED_SLOT)
    return {"shards": wire.TABLE_SHARDS, "slot": wire.DEFERRED_SLOT.isoformat(), "rows": [{"due": due, "index": index}]}


def azure_table_placed() -> dict[str, Any]:
    """The store message's due row as placement leaves it on the table (placed on its queue, hidden until due)."""
    message = store_message()
    due, index = to_entities(message, shard_of(message.message_id, wire.TABLE_SHARDS))
    patch = placed_patch(due["PartitionKey"], due["RowKey"], wire.PLACED_QUEUE_MESSAGE_ID, wire.PLACED_POP_RECEIPT)
    return {"shards": wire.TABLE_SHARDS, "rows": [{"due": {**due, **patch, "ClaimToken": "0" * 32}, "index": index}]}


def azure_table_placing() -> dict[str, Any]:
    """The store message's due row as a placer's claim leaves it before its put (claimed, ``Placing`` marked), and
    as a later placement records it while an earlier copy was never recorded (placed, the mark kept)."""
    message = store_message()
    due, index = to_entities(message, shard_of(message.message_id, wire.TABLE_SHARDS))
    token = "1" * 32
    claim = {"AvailableAt": due_key(wire.STORE_DUE - timedelta(hours=1)), "ClaimToken": token}
    placed = placed_patch(due["PartitionKey"], due["RowKey"], wire.PLACED_QUEUE_MESSAGE_ID, wire.PLACED_POP_RECEIPT)
    return {
        "shards": wire.TABLE_SHARDS,
        "rows": [
            {"due": {**due, **claim, **placing_mark(token)}, "index": index},
            {"due": {**due, **placed, "ClaimToken": "2" * 32, **placing_mark(token)}, "index": index},
        ],
    }


def azure_table_sending() -> dict[str, Any]:
    """The store message's due row as a dispatcher's claim leaves it before its put (claimed, ``Sending`` marked), as
    the run gives it back with its send's outcome unknown (the mark kept), and as release control defers it with an
    earlier claim's mark (kept on the re-keyed row)."""
    from azure.data.tables import TableClient

    from delayed_delivery.azure.rows import DueRow
    from delayed_delivery.azure.table_gateway import TableGateway

    message = store_message()
    due, index = to_entities(message, shard_of(message.message_id, wire.TABLE_SHARDS))
    token, earlier = "3" * 32, "4" * 32
    claimed = {**due, "AvailableAt": due_key(wire.STORE_DUE + timedelta(seconds=60)), "ClaimToken": token}
    claimed.update(sending_mark(token))
    gateway = TableGateway(TableClient.from_connection_string(wire.OFFLINE_ACCOUNT, "goldenrows"), wire.TABLE_SHARDS)
    row = DueRow(due["PartitionKey"], due["RowKey"], "etag", claimed["AvailableAt"], message)  # its claim marked it
    [(_, given_back, _)] = gateway.release_ops(row)
    remarked = DueRow(row.partition_key, row.row_key, "etag", row.available_at, message, sending=earlier)
    create, upsert = gateway.defer_ops(remarked, wire.DEFERRED_SLOT)[:2]  # an earlier claim's mark: kept
    return {
        "shards": wire.TABLE_SHARDS,
        "slot": wire.DEFERRED_SLOT.isoformat(),
        "rows": [
            {"due": claimed, "index": index},
            {"due": {**claimed, **given_back}, "index": index},
            {"due": create[1], "index": upsert[1]},
        ],
    }


def azure_table_layout() -> dict[str, Any]:
    """The layout entity of a delays table: its shard count as recorded, and while a reshard runs."""
    at = wire.STORE_DUE
    return {
        "recorded": layout_entity(wire.TABLE_SHARDS, at),
        "resharding": layout_entity(wire.TABLE_SHARDS, at, wire.TABLE_SHARDS * 2),
    }


def sqlite_row(folder: Path) -> dict[str, Any]:
    """The SQLite schema and the row ``store`` writes."""
    path = folder / "golden.db"
    store = SqliteDelayedMessageStore(path)
    store.setup_infrastructure()
    store.store(store_message())
    store.close()
    with sqlite3.connect(path) as conn:
        schema = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")]
        cursor = conn.execute("SELECT * FROM delayed_messages")
        columns = [d[0] for d in cursor.description]
        [row] = cursor.fetchall()
    conn.close()
    return {"table": "delayed_messages", "schema": schema, "row": dict(zip(columns, row, strict=True))}


_PG_TIME = "to_char({0} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')"


def postgres_row(conninfo: str, table: str) -> dict[str, Any]:
    """The PostgreSQL columns and the row ``store`` writes (times as UTC ISO text, headers as stored)."""
    import psycopg

    from delayed_delivery.postgres.store import PostgresDelayedMessageStore

    store = PostgresDelayedMessageStore(conninfo, table=table)
    store.setup_infrastructure()
    try:
        store.store(store_message())
        with psycopg.connect(conninfo) as conn:
            columns = conn.execute(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
                " WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
                (table,),
            ).fetchall()
            row = conn.execute(
                "SELECT message_id, destination, body, headers::text,"
                f" {_PG_TIME.format('due_at')}, {_PG_TIME.format('available_at')}, failure_count"
                f' FROM "{table}"'
            ).fetchone()
    finally:
        store.drop_infrastructure()
        store.close()
    assert row is not None
    names = ("message_id", "destination", "body", "headers", "due_at", "available_at", "failure_count")
    values = dict(zip(names, row, strict=True))
    values["body"] = bytes(values["body"])
    return {"columns": [list(c) for c in columns], "row": values}
