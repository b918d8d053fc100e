"""User data is never markup: ids, queue names, headers and bodies holding ``[bold]``, ``[/x]`` and ``\\[`` go through
every command, in text and ``--json``, and come back byte for byte (stored, printed, and accepted again by the next
command). Error lines quote a name or id as Python does (``repr``); that is the only change, and it is the same text
the library raised."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.ports import claim_of
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore
from tests.app.cli.conftest import ok_json, one_line_error, run

#: The markup a careless producer may put in its data: a style tag, a closing tag Rich refuses, Rich's escape.
IDS = ("job[bold]42", "job[/x]43", "job\\[44")
BODY = '{"note": "[bold]loud[/bold] [/x] \\\\[not markup]"}'
HEADER = ("kind", "[red]Reminder[/x] \\[x]")
QUEUES = ("or[bold]ders", "or[/x]ders", "or\\[ders")


def _ok(*args: str) -> str:
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.stdout


@pytest.mark.parametrize("message_id", IDS)
def test_the_store_route_keeps_ids_headers_and_bodies(tmp_path: Path, message_id: str) -> None:
    path = tmp_path / "delays.db"
    route = ["--store", f"sqlite:///{path}"]
    due = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0).isoformat()
    send = ["send", *route, "--to", "orders", "--at", due, "--body", BODY, "-H", "=".join(HEADER)]

    printed = _ok(*send, "--id", message_id)
    assert printed.startswith(f"{message_id}  → orders at "), printed
    assert ok_json(*send, "--id", message_id)["message_id"] == message_id  # the same message again: a no-op

    store = SqliteDelayedMessageStore(str(path))
    [stored] = store.fetch_due(datetime.now(UTC) + timedelta(days=1), 10)
    assert stored.message_id == message_id and stored.body == BODY.encode()
    assert dict(stored.headers)[HEADER[0]] == HEADER[1]
    store.reschedule(message_id, stored.due_at, claim=claim_of(stored))  # release the test's claim

    at = (datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0).isoformat()
    assert _ok("reschedule", message_id, *route, "--at", at).startswith(f"rescheduled {message_id} to ")
    assert ok_json("reschedule", message_id, *route, "--at", at)["message_id"] == message_id
    assert ok_json("pending", *route)["pending"] == 1
    assert _ok("cancel", message_id, *route) == f"cancelled {message_id} (route: store)\n"
    one_line_error(run("cancel", message_id, *route), f"no pending message {message_id!r}")
    ok_json("send", *route, "--to", "orders", "--delay", "2h", "--body", BODY, "--id", message_id)
    assert ok_json("cancel", message_id, *route) == {"message_id": message_id, "cancelled": True, "route": "store"}


@pytest.mark.parametrize("queue", QUEUES)
def test_a_bad_queue_name_is_quoted_as_given(tmp_path: Path, queue: str) -> None:
    route = ["--store", f"sqlite:///{tmp_path / 'delays.db'}"]
    for extra in ([], ["--json"]):
        line = one_line_error(run("send", *route, "--to", queue, "--delay", "1h", "--body", "x", *extra), repr(queue))
        assert "Traceback" not in line


@pytest.mark.parametrize("text", [*IDS, *QUEUES])
def test_bad_option_values_are_quoted_as_given(text: str) -> None:
    one_line_error(run("cost", "--delay", text), repr(text))
    one_line_error(run("pending", "--store", "sqlite:///x.db", "--by", text), "--by must be hour or day")
    one_line_error(run("send", "--store", "sqlite:///x.db", "--to", "q", "--at", text, "--body", "b"), repr(text))


@pytest.mark.moto
def test_the_aws_route_and_the_aws_commands(moto_endpoint: str, sqs: Any) -> None:
    aws = ["--cloud", "aws", "--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    where = ["--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    created = json.loads(_ok("aws", "create", "--queue", "orders", *where, "--no-buckets"))
    for message_id in IDS:
        _aws_round_trip(sqs, aws, where, created["input"], message_id)
    for queue in QUEUES:
        one_line_error(run("aws", "check", "--queue", queue, *where), repr(queue))
        one_line_error(run("send", *aws, "--to", queue, "--delay", "1h", "--body", "x"), repr(queue))


def _aws_round_trip(sqs: Any, aws: list[str], where: list[str], input_url: str, message_id: str) -> None:
    sent = ok_json("send", *aws, "--to", "orders", "--delay", "0s", "--body", BODY, "-H", "=".join(HEADER),
                   "--id", message_id)  # fmt: skip
    assert sent["message_id"] == message_id
    got = sqs.receive_message(QueueUrl=input_url, WaitTimeSeconds=2, MessageAttributeNames=["All"])
    [message] = got["Messages"]
    assert message["Body"] == BODY and message["MessageAttributes"][HEADER[0]]["StringValue"] == HEADER[1]
    sqs.delete_message(QueueUrl=input_url, ReceiptHandle=message["ReceiptHandle"])

    printed = _ok("send", *aws, "--to", "orders", "--delay", "40d", "--body", BODY, "--id", message_id)
    assert printed.startswith(f"{message_id}  → orders at "), printed
    assert f"cancel of {message_id} accepted" in _ok("cancel", message_id, *aws, "--to", "orders")
    assert ok_json("cancel", message_id, *aws, "--to", "orders")["message_id"] == message_id
    assert ok_json("reschedule", message_id, *aws, "--to", "orders", "--delay", "3d")["message_id"] == message_id

    via_group = json.loads(_ok("aws", "send", "--queue", "orders", "--delay", "40d", "--body", BODY,
                               "--message-id", message_id, *where))  # fmt: skip
    assert via_group["message_id"] == message_id


@pytest.mark.moto
def test_the_tier_lists_records_of_any_id_as_they_are(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The original crash: a record whose id held ``[/x]`` broke ``pending`` for every operator while it lived."""
    monkeypatch.setenv("DELAYED_DELIVERY_CANCELLATION_TABLE", "markup-records")
    where = ["--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    _ok("aws", "create", "--queue", "orders", *where, "--buckets", "--bucket-name", "markup-tier")
    tier = ["--cloud", "aws", *where, "--bucket-name", "markup-tier"]
    due = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0).isoformat()
    for message_id in IDS:
        assert ok_json("cancel", message_id, *tier, "--to", "orders", "--at", due)["message_id"] == message_id
    listed = _ok("pending", *tier)
    for message_id in IDS:
        assert f"  cancel {message_id} on orders\n" in listed, listed
    records = ok_json("pending", *tier)["buckets"]["records"]
    assert sorted(r["message_id"] for r in records) == sorted(IDS)


@pytest.mark.azurite
def test_the_azure_route_and_the_azure_commands(azurite_conn: str, unique_name: str) -> None:
    connection = ["--connection-string", azurite_conn]
    _ok("azure", "setup", *connection, "--endpoint", unique_name, "--queue", "orders")
    for message_id in IDS:
        _azure_round_trip(azurite_conn, unique_name, message_id)


def _azure_round_trip(azurite_conn: str, unique_name: str, message_id: str) -> None:
    from delayed_delivery.azure.table_store import TableDelayedMessageStore

    connection = ["--connection-string", azurite_conn]
    azure = ["--cloud", "azure", *connection, "--endpoint", unique_name]
    due = (datetime.now(UTC) + timedelta(days=40)).replace(microsecond=0).isoformat()
    send = ["send", *azure, "--to", "orders", "--at", due, "--body", BODY, "-H", "=".join(HEADER)]
    printed = _ok(*send, "--id", message_id)
    assert printed.startswith(f"{message_id}  → orders at "), printed
    sent = ok_json(*send, "--id", message_id)
    assert sent["message_id"] == message_id

    # read as stored, not fetched: a fetch claims the row for sending, and a row a dispatcher may have put on its
    # queue is refused to operators from then on (#34)
    store = TableDelayedMessageStore.from_connection_string(azurite_conn, sent["table"])
    stored = store.get(message_id)
    assert stored is not None and stored.message_id == message_id and stored.body == BODY.encode()
    assert dict(stored.headers)[HEADER[0]] == HEADER[1]

    assert _ok("reschedule", message_id, *azure, "--delay", "41d").startswith(f"rescheduled {message_id} to ")
    assert _ok("cancel", message_id, *azure) == f"cancelled {message_id} (route: azure)\n"
    group = json.loads(_ok("azure", "send", "--queue", "orders", "--delay", "1h", "--body", BODY, "--endpoint",
                           unique_name, *connection))  # fmt: skip
    assert group["route"] == "native"
    endpoint = f"sh[bold]op{message_id}"
    assert json.loads(_ok("azure", "names", "--endpoint", endpoint))["endpoint"] == endpoint
