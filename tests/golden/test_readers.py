"""Today's readers read every golden file: messages already waiting in a queue or a table are never stranded.

Each test builds what a reader meets in production from a golden file only (a Lambda SQS record, a queue text,
a table entity, a row inserted with plain SQL) and checks every field: id, destination, body bytes, headers or
attributes, due time or remaining delay, hop.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.fifo_ids import deduplication_id, sent_of
from delayed_delivery.aws.packing import (
    ENVELOPE_ATTRIBUTE,
    BadItem,
    PackedMessage,
    content_fingerprint,
    decode_envelope,
)
from delayed_delivery.aws.requeue import HopOutcome
from delayed_delivery.aws.sqs import normalize_attributes
from delayed_delivery.aws.tier.ingest_format import INGEST_ATTRIBUTE, decode_ingest
from delayed_delivery.azure import rows
from delayed_delivery.azure.storage_queue import decode_envelope as decode_queue_text
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE, FAILED_AT, FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.model import DelayedMessage
from delayed_delivery.ports import claim_of, slot_of
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore
from delayed_delivery.timebuckets.format import BucketMessage
from tests.golden import wire
from tests.golden.captures import requeuer

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

#: The user attributes of the golden SQS messages, in the boto3 shape.
USER_ATTRIBUTES: dict[str, Any] = {
    "kind": {"DataType": "String", "StringValue": "order"},
    "trace": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe\xff golden"},
    "priority": {"DataType": "Number", "StringValue": "7"},
    "schema": {"DataType": "String.json", "StringValue": '{"v":2}'},
}
#: The store message of the Azure and SQL goldens.
STORED = DelayedMessage(
    wire.STORE_ID, wire.STORE_DESTINATION, wire.STORE_BODY, wire.STORE_DUE, wire.STORE_HEADERS, wire.STORE_FAILURES
)
BIG = DelayedMessage(wire.BIG_ID, wire.STORE_DESTINATION, wire.BIG_BODY, wire.STORE_DUE, wire.STORE_HEADERS)


def _same_message(got: DelayedMessage, expected: DelayedMessage) -> None:
    assert got.message_id == expected.message_id
    assert got.destination == expected.destination
    assert got.body == expected.body
    assert dict(got.headers) == dict(expected.headers)
    assert got.due_at == expected.due_at
    assert got.failure_count == expected.failure_count


def _hop(client: SQSClient, request: dict[str, Any], *, sent_ms: int, elapsed_ms: int) -> tuple[Any, dict[str, Any]]:
    """Run the requeue step on a record of ``request`` received ``elapsed_ms`` after ``sent_ms``: (result, sent)."""
    wire.create_queues(client)
    calls = wire.record_calls(client)
    record = wire.lambda_record(
        request, record_id="golden-record", sent_ms=sent_ms, first_receive_ms=sent_ms + elapsed_ms
    )
    [result] = requeuer(client, sent_ms + elapsed_ms + 50).process([record])
    [call] = calls
    return result, call


@pytest.mark.moto
@pytest.mark.parametrize("golden", wire.versions("sqs_send"))
def test_requeue_reads_the_senders_fifo_message(sqs: SQSClient, golden: str) -> None:
    request = wire.load(golden)["fifo"]
    assert request["Queue"] == "orders-delay.fifo"
    result, call = _hop(sqs, request, sent_ms=wire.SENT_MS, elapsed_ms=901_234)
    assert (result.outcome, result.message_id, result.hop, result.destination) == (
        HopOutcome.REQUEUED,
        wire.MESSAGE_ID,
        1,
        "orders",
    )
    assert result.remaining_delay_s == 258_299
    [entry] = call["Entries"]
    assert call["Queue"] == "orders-delay.fifo"
    assert entry["MessageBody"] == wire.BODY
    # The first hop carries the content fingerprint and the first send (the record's SentTimestamp) in every version.
    fp = content_fingerprint(wire.BODY, USER_ATTRIBUTES)
    assert entry["MessageGroupId"] == wire.MESSAGE_ID
    assert entry["MessageDeduplicationId"] == deduplication_id(wire.MESSAGE_ID, 1, fp, wire.SENT_MS)
    control = {"DataType": "Number", "StringValue": "258298.766"}
    assert entry["MessageAttributes"] == {**USER_ATTRIBUTES, DELAY_SECONDS_ATTRIBUTE: control}


@pytest.mark.moto
@pytest.mark.parametrize("golden", wire.versions("sqs_requeue"))
def test_requeue_reads_its_own_hop_with_fractional_seconds(sqs: SQSClient, golden: str) -> None:
    [request] = wire.load(golden)["hop"]["Entries"]
    result, call = _hop(sqs, request, sent_ms=wire.SENT_MS, elapsed_ms=900_500)
    assert (result.outcome, result.message_id, result.hop) == (HopOutcome.REQUEUED, wire.MESSAGE_ID, 2)
    [entry] = call["Entries"]
    # v1 (an older requeue's <id>:1) carries no first send time, v2 on do: the next hop keeps what it knew.
    sent = sent_of(request["MessageDeduplicationId"], wire.MESSAGE_ID)
    assert sent == (None if wire.version_of(golden) == 1 else wire.SENT_MS)
    fp = content_fingerprint(wire.BODY, USER_ATTRIBUTES)
    assert entry["MessageDeduplicationId"] == deduplication_id(wire.MESSAGE_ID, 2, fp, sent)
    assert entry["MessageBody"] == wire.BODY
    control = {"DataType": "Number", "StringValue": "257398.266"}  # 258,298.766 s less the 900.5 s just waited
    assert entry["MessageAttributes"] == {**USER_ATTRIBUTES, DELAY_SECONDS_ATTRIBUTE: control}


@pytest.mark.moto
@pytest.mark.parametrize("golden", wire.versions("sqs_requeue"))
def test_requeue_forwards_the_golden_hop_when_it_is_due(sqs: SQSClient, golden: str) -> None:
    [request] = wire.load(golden)["hop"]["Entries"]
    result, call = _hop(sqs, request, sent_ms=wire.SENT_MS, elapsed_ms=258_298_766 - 120_000)
    assert (result.outcome, result.message_id, result.hop, result.destination) == (
        HopOutcome.FORWARDED,
        wire.MESSAGE_ID,
        2,
        "orders",
    )
    [entry] = call["Entries"]
    assert call["Queue"] == "orders"
    assert entry["DelaySeconds"] == 120
    assert entry["MessageBody"] == wire.BODY
    attributes = dict(entry["MessageAttributes"])
    delivery = decode_delivery(attributes.pop(DELIVERY_HEADER)["StringValue"])  # added for the consumer (#16)
    assert attributes == USER_ATTRIBUTES
    assert (delivery.message_id, delivery.hops, delivery.route) == (wire.MESSAGE_ID, 2, "fifo")


def _batch_expected(hop: int, remaining_ms: int) -> list[PackedMessage]:
    return [
        PackedMessage(
            "golden-batch-a",
            hop,
            remaining_ms,
            "first",
            {
                "kind": {"DataType": "String", "StringValue": "a"},
                "blob": {"DataType": "Binary", "BinaryValue": b"\x10 0"},
            },
        ),
        PackedMessage(
            "golden-batch-b", hop, remaining_ms, "second ✓", {"kind": {"DataType": "String", "StringValue": "b"}}
        ),
        PackedMessage("golden-batch-c", hop, remaining_ms, "third", {}),
    ]


@pytest.mark.parametrize(
    ("golden", "part", "hop", "remaining_ms"),
    [
        (golden, part, hop, remaining)
        for golden in wire.versions("sqs_envelope")
        for part, hop, remaining in (("sent", 0, 259_200_000), ("requeued", 1, 258_298_766))
    ],
)
def test_decode_envelope_reads_the_golden_envelopes(golden: str, part: str, hop: int, remaining_ms: int) -> None:
    [entry] = wire.load(golden)[part]["Entries"]
    assert entry["MessageAttributes"] == {ENVELOPE_ATTRIBUTE: {"DataType": "String", "StringValue": "1"}}
    assert entry["MessageGroupId"] == entry["MessageDeduplicationId"]
    assert entry["MessageGroupId"].startswith("pack-")
    decoded = decode_envelope(entry["MessageBody"])
    assert not any(isinstance(item, BadItem) for item in decoded)
    # From v3 on the requeue step writes each entry's first send time (the sender's hop 0 needs none).
    sent = wire.SENT_MS if part == "requeued" and wire.version_of(golden) >= 3 else None
    assert decoded == [replace(m, sent_ms=sent) for m in _batch_expected(hop, remaining_ms)]


@pytest.mark.moto
@pytest.mark.parametrize("golden", wire.versions("sqs_envelope"))
def test_requeue_unpacks_the_golden_envelope_and_forwards_each_message(sqs: SQSClient, golden: str) -> None:
    [request] = wire.load(golden)["requeued"]["Entries"]
    result, call = _hop(sqs, request, sent_ms=wire.SENT_MS, elapsed_ms=258_298_766 - 60_000)
    assert result.outcome is HopOutcome.UNPACKED
    inner = [(r.message_id, r.outcome, r.hop, r.destination) for r in result.inner]
    assert inner == [(m, HopOutcome.FORWARDED, 2, "orders") for m, _, _ in wire.BATCH]
    assert call["Queue"] == "orders"
    sent = [(e["MessageBody"], e.get("MessageAttributes", {}), e["DelaySeconds"]) for e in call["Entries"]]
    # The forwards carry the delivery header for the consumer (#16) beside the user's attributes.
    ids = [decode_delivery(a[DELIVERY_HEADER]["StringValue"]).message_id for _, a, _ in sent]
    assert ids == [m for m, _, _ in wire.BATCH]
    sent = [(body, {k: v for k, v in a.items() if k != DELIVERY_HEADER}, d) for body, a, d in sent]
    assert sent == [(m.body, m.attributes, 60) for m in _batch_expected(1, 0)]


@pytest.mark.parametrize("golden", wire.versions("sqs_ingest"))
def test_decode_ingest_reads_the_golden_ingest_envelopes(golden: str) -> None:
    stored = wire.load(golden)
    due, sent = wire.SENT_MS + wire.LONG_DELAY * 1000, wire.SENT_MS
    expected = {
        "single": [BucketMessage(wire.MESSAGE_ID, "orders", wire.BODY.encode(), due, USER_ATTRIBUTES, 0, sent)],
        "batch": [
            BucketMessage(mid, "orders", body.encode(), due, normalize_attributes(attrs), 0, sent)
            for mid, body, attrs in wire.BATCH
        ],
    }
    for part, messages in expected.items():
        assert stored[part]["Queue"] == wire.INGEST_QUEUE
        [entry] = stored[part]["Entries"]
        assert entry["MessageAttributes"] == {INGEST_ATTRIBUTE: {"DataType": "String", "StringValue": "1"}}
        decoded = decode_ingest(entry["MessageBody"])
        assert decoded == messages
        for got, want in zip(decoded, messages, strict=True):
            assert isinstance(got, BucketMessage) and dict(got.attributes) == dict(want.attributes)


@pytest.mark.parametrize("golden", wire.versions("sqs_error_queue"))
def test_error_queue_golden_names_the_reason_destination_and_time(golden: str) -> None:
    call = wire.load(golden)["error"]
    assert call["Queue"] == "error"
    [entry] = call["Entries"]
    attributes = entry["MessageAttributes"]
    assert entry["MessageBody"] == wire.BODY
    assert attributes[FAILURE_REASON]["StringValue"] == f"missing control attribute {DELAY_SECONDS_ATTRIBUTE}"
    assert attributes[ORIGINAL_DESTINATION]["StringValue"] == "orders"
    failed_at = datetime.fromisoformat(attributes[FAILED_AT]["StringValue"])
    assert failed_at == datetime.fromtimestamp((wire.SENT_MS + 901_284) / 1000, UTC)
    user = {k: v for k, v in attributes.items() if k not in (FAILURE_REASON, ORIGINAL_DESTINATION, FAILED_AT)}
    assert user == USER_ATTRIBUTES


@pytest.mark.parametrize("golden", wire.versions("azure_queue"))
def test_azure_decode_envelope_reads_the_golden_queue_text(golden: str) -> None:
    envelope = decode_queue_text(wire.load(golden)["text"])
    assert envelope.message_id == wire.STORE_ID
    assert envelope.body == wire.STORE_BODY
    assert dict(envelope.headers) == wire.STORE_HEADERS


@pytest.mark.parametrize("golden", wire.versions("azure_table"))
def test_azure_row_reader_reads_the_golden_entities(golden: str) -> None:
    document = wire.load(golden)
    shards = document["shards"]
    for row, expected in zip(document["rows"], (STORED, BIG), strict=True):
        due, index = row["due"], row["index"]
        _same_message(rows.message_from_entity(due), expected)
        # Today's code finds the old rows by id: same partition, same index row, which points at the due row.
        assert (
            due["PartitionKey"]
            == index["PartitionKey"]
            == rows.partition_key(rows.shard_of(expected.message_id, shards))
        )
        assert index["RowKey"] == rows.index_row_key(expected.message_id)
        assert index["DueRowKey"] == due["RowKey"] == rows.due_row_key(expected.due_at, expected.message_id)
        assert rows.from_due_key(due["AvailableAt"]) == expected.due_at
    assert document["rows"][1]["due"]["BodyChunks"] == 2, "the golden holds a chunked body"


@pytest.mark.azurite
@pytest.mark.parametrize("golden", wire.versions("azure_table"))
def test_azure_table_store_fetches_the_golden_entities(azurite: Any, golden: str) -> None:
    from tests.azure.conftest import make_store, new_name

    document = wire.load(golden)
    store = make_store(azurite.connection_string, new_name(), shards=document["shards"])
    try:
        for row in document["rows"]:
            store.table.create_entity(row["due"])
            store.table.create_entity(row["index"])
        fetched = store.fetch_due(wire.STORE_DUE + timedelta(seconds=1), 10)
        got = sorted(fetched, key=lambda m: m.message_id)
        assert len(got) == 2
        for message, expected in zip(got, sorted((STORED, BIG), key=lambda m: m.message_id), strict=True):
            _same_message(message, expected)
    finally:
        store.drop()


@pytest.mark.parametrize("golden", wire.versions("azure_table_deferred"))
def test_azure_row_reader_reads_the_golden_deferred_rows(golden: str) -> None:
    document = wire.load(golden)
    [row] = document["rows"]
    due, index = row["due"], row["index"]
    slot = datetime.fromisoformat(document["slot"])
    _same_message(rows.message_from_entity(due), STORED)  # its own due time, not the slot it waits for
    assert rows.deferred_slot(due) == slot
    assert (
        due["PartitionKey"]
        == index["PartitionKey"]
        == rows.partition_key(rows.shard_of(STORED.message_id, document["shards"]))
    )
    assert index["DueRowKey"] == due["RowKey"] == rows.due_row_key(slot, STORED.message_id)


@pytest.mark.azurite
@pytest.mark.parametrize("golden", wire.versions("azure_table_deferred"))
def test_azure_table_store_fetches_a_golden_deferred_row_at_its_slot(azurite: Any, golden: str) -> None:
    from tests.azure.conftest import make_store, new_name

    document = wire.load(golden)
    slot = datetime.fromisoformat(document["slot"])
    store = make_store(azurite.connection_string, new_name(), shards=document["shards"])
    try:
        [row] = document["rows"]
        store.table.create_entity(row["due"])
        store.table.create_entity(row["index"])
        assert store.fetch_due(slot - timedelta(microseconds=1), 10) == [], "kept back until its slot"
        assert store.next_due() == slot
        [message] = store.fetch_due(slot, 10)
        _same_message(message, STORED)
        assert slot_of(message) == slot
        assert store.remove(STORED.message_id, claim_of(message)) is True
    finally:
        store.drop()


@pytest.mark.azurite
@pytest.mark.parametrize("golden", wire.versions("azure_table_placed"))
def test_azure_table_store_never_fetches_a_golden_placed_row_refuses_operators_and_sweeps_it(
    azurite: Any, golden: str
) -> None:
    from delayed_delivery.azure.destinations import DestinationPolicy
    from delayed_delivery.azure.placement import SWEEP_AFTER, Placer
    from delayed_delivery.azure.storage_queue import StorageQueueTransport
    from delayed_delivery.clock import ManualClock
    from delayed_delivery.errors import MessagePlacedError
    from tests.azure.conftest import make_store, new_name

    document = wire.load(golden)
    store = make_store(azurite.connection_string, new_name(), shards=document["shards"])
    try:
        [row] = document["rows"]
        store.table.create_entity(row["due"])
        store.table.create_entity(row["index"])
        _same_message(rows.message_from_entity(row["due"]), STORED)
        assert store.fetch_due(wire.STORE_DUE + timedelta(days=400), 10) == [], "on its queue: never fetched"
        assert store.next_due() is None
        with pytest.raises(MessagePlacedError, match=STORED.message_id):
            store.remove(STORED.message_id)
        shard = rows.shard_of(STORED.message_id, document["shards"])
        after = ManualClock(wire.STORE_DUE + timedelta(seconds=SWEEP_AFTER + 1))
        transport = StorageQueueTransport.from_connection_string(azurite.connection_string)
        placer = Placer(
            store.table,
            document["shards"],
            shard,
            transport,
            DestinationPolicy("e"),
            lead=60,
            clock=after,
            claim_timeout=30,
        )
        assert placer.sweep() == 1 and store.get(STORED.message_id) is None, "swept once due"
    finally:
        store.drop()


@contextmanager
def _table_holding(azurite: Any, shards: int, due: dict[str, Any], index: dict[str, Any]) -> Iterator[Any]:
    """A store on a fresh table holding one golden pair of rows (dropped afterwards)."""
    from tests.azure.conftest import make_store, new_name

    store = make_store(azurite.connection_string, new_name(), shards=shards)
    try:
        store.table.create_entity(due)
        store.table.create_entity(index)
        yield store
    finally:
        store.drop()


def _mark_on_table(store: Any, name: str) -> Any:
    """The property ``name`` of the stored message's due row as the table has it now."""
    located = store._rows.locate(STORED.message_id)
    assert located is not None
    return store.table.get_entity(*located)[name]


@pytest.mark.azurite
@pytest.mark.parametrize("golden", wire.versions("azure_table_placing"))
def test_azure_table_store_refuses_operators_on_golden_placing_rows_and_sends_them_when_due(
    azurite: Any, golden: str
) -> None:
    from delayed_delivery.azure.placed_ops import is_placed
    from delayed_delivery.errors import MessageInFlightError

    document = wire.load(golden)
    for pair in document["rows"]:
        row = pair["due"]
        with _table_holding(azurite, document["shards"], row, pair["index"]) as store:
            _same_message(rows.message_from_entity(row), STORED)
            with pytest.raises(MessageInFlightError, match=STORED.message_id):  # a copy may wait on its queue
                store.remove(STORED.message_id)
            with pytest.raises(MessageInFlightError, match=STORED.message_id):
                store.reschedule(STORED.message_id, wire.STORE_DUE + timedelta(days=1))
            if is_placed(row):
                assert store.fetch_due(wire.STORE_DUE + timedelta(days=400), 10) == [], "on its queue"
            else:  # its placer's claim expired: the dispatcher sends it when due; the mark stays
                [message] = store.fetch_due(wire.STORE_DUE, 10)
                _same_message(message, STORED)
                assert _mark_on_table(store, rows.PLACING) == row[rows.PLACING]


@pytest.mark.azurite
@pytest.mark.parametrize("golden", wire.versions("azure_table_sending"))
def test_azure_table_store_refuses_operators_on_golden_sending_rows_and_sends_them_keeping_the_mark(
    azurite: Any, golden: str
) -> None:
    from delayed_delivery.errors import MessageInFlightError, MessagePlacedError

    document = wire.load(golden)
    slot = datetime.fromisoformat(document["slot"])
    claim_ends = rows.from_due_key(document["rows"][0]["due"]["AvailableAt"])
    # claimed (its claim lasts until after the due time), given back with its outcome unknown, deferred with a mark
    fetch_at = [claim_ends + timedelta(seconds=1), wire.STORE_DUE, slot]
    for pair, at in zip(document["rows"], fetch_at, strict=True):
        row = pair["due"]
        with _table_holding(azurite, document["shards"], row, pair["index"]) as store:
            _same_message(rows.message_from_entity(row), STORED)
            for change, args in (
                (store.remove, ()),
                (store.reschedule, (wire.STORE_DUE + timedelta(days=1),)),
            ):
                with pytest.raises(MessageInFlightError, match=STORED.message_id) as refused:
                    change(STORED.message_id, *args)
                # its claim lasts (the operator's clock is before 2031): in flight; a claim that ended: may be sent
                assert isinstance(refused.value, MessagePlacedError) == (not row.get("ClaimToken"))
            [message] = store.fetch_due(at, 10)
            _same_message(message, STORED)
            assert _mark_on_table(store, rows.SENDING) == row[rows.SENDING]


@pytest.mark.azurite
@pytest.mark.parametrize("golden", wire.versions("azure_table"))
def test_a_golden_row_claimed_by_a_dispatcher_before_the_sending_mark_refuses_operators(
    azurite: Any, golden: str
) -> None:
    from delayed_delivery.errors import MessagePlacedError

    document = wire.load(golden)
    pair = document["rows"][0]
    # what an older dispatcher's claim wrote on it (no Sending property), its claim long over
    claimed = {**pair["due"], "AvailableAt": rows.due_key(wire.STORE_DUE), "ClaimToken": "5" * 32}
    with _table_holding(azurite, document["shards"], claimed, pair["index"]) as store:
        with pytest.raises(MessagePlacedError, match="may already be on its way"):
            store.remove(STORED.message_id)
        [message] = store.fetch_due(wire.STORE_DUE, 10)
        assert store.remove(STORED.message_id, claim_of(message)) is True, "its dispatcher delivers and removes it"


@pytest.mark.parametrize("golden", wire.versions("azure_table_layout"))
def test_azure_layout_reader_reads_the_golden_layout(golden: str) -> None:
    from delayed_delivery.azure.layout import Layout, layout_of

    document = wire.load(golden)
    assert layout_of(document["recorded"], "t") == Layout(wire.TABLE_SHARDS)
    assert layout_of(document["resharding"], "t") == Layout(wire.TABLE_SHARDS, wire.TABLE_SHARDS * 2)


@pytest.mark.azurite
@pytest.mark.parametrize("golden", wire.versions("azure_table_layout"))
def test_every_process_reads_the_golden_layout_from_the_table(azurite: Any, golden: str) -> None:
    from delayed_delivery.azure.layout import resolve_shards
    from tests.azure.conftest import make_store, new_name

    document = wire.load(golden)
    store = make_store(azurite.connection_string, new_name())
    try:
        store.table.create_entity(document["recorded"])
        assert resolve_shards(store.table, 1, configured=False) == wire.TABLE_SHARDS
        store.table.upsert_entity(document["resharding"])
        with pytest.raises(ConfigurationError, match="being resharded"):
            resolve_shards(store.table, wire.TABLE_SHARDS, configured=True)
    finally:
        store.drop()


@pytest.mark.parametrize("golden", wire.versions("sqlite_row"))
def test_sqlite_store_reads_a_golden_row_in_a_golden_table(tmp_path: Path, golden: str) -> None:
    document = wire.load(golden)
    path = tmp_path / "old.db"
    row = document["row"]
    with sqlite3.connect(path) as conn:
        for statement in document["schema"]:
            conn.execute(statement)
        names = ", ".join(row)
        conn.execute(
            f"INSERT INTO {document['table']} ({names}) VALUES ({', '.join('?' * len(row))})", list(row.values())
        )
    conn.close()
    store = SqliteDelayedMessageStore(path, table=document["table"])
    try:
        store.setup_infrastructure()
        assert store.fetch_due(wire.STORE_DUE - timedelta(microseconds=1), 10) == []
        [message] = store.fetch_due(wire.STORE_DUE, 10)
        _same_message(message, STORED)
    finally:
        store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("golden", wire.versions("postgres_row"))
def test_postgres_store_reads_a_golden_row(postgres_conninfo: str, postgres_table: str, golden: str) -> None:
    import psycopg

    from delayed_delivery.postgres.store import PostgresDelayedMessageStore

    document = wire.load(golden)
    store = PostgresDelayedMessageStore(postgres_conninfo, table=postgres_table)
    store.setup_infrastructure()
    try:
        with psycopg.connect(postgres_conninfo) as conn:
            found = conn.execute(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
                " WHERE table_schema = 'public' AND table_name = %s",
                (postgres_table,),
            ).fetchall()
            assert {tuple(c) for c in document["columns"]} <= set(found), "a golden column changed"
            row = document["row"]
            conn.execute(
                f'INSERT INTO "{postgres_table}" (message_id, destination, body, headers, due_at, available_at,'
                " failure_count) VALUES (%s, %s, %s, %s::json, %s::timestamptz, %s::timestamptz, %s)",
                (
                    row["message_id"],
                    row["destination"],
                    row["body"],
                    row["headers"],
                    row["due_at"],
                    row["available_at"],
                    row["failure_count"],
                ),
            )
        assert store.fetch_due(wire.STORE_DUE - timedelta(microseconds=1), 10) == []
        [message] = store.fetch_due(wire.STORE_DUE, 10)
        _same_message(message, STORED)
    finally:
        store.drop_infrastructure()
        store.close()


def test_every_kind_of_golden_exists() -> None:
    kinds = ("sqs_send", "sqs_requeue", "sqs_envelope", "sqs_error_queue", "sqs_ingest", "azure_queue", "azure_table")
    kinds = (*kinds, "azure_table_deferred", "azure_table_layout", "azure_table_placed", "azure_table_placing")
    kinds = (*kinds, "azure_table_sending")
    for kind in (*kinds, "sqlite_row", "postgres_row"):
        assert wire.versions(kind), f"no golden file for {kind}: its reader tests would not run"
