"""The Azure route against Azurite: send (native / table), exact pending, reschedule and cancel on the table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.ports import claim_of
from tests.app.cli.conftest import ok_json, one_line_error, run

pytestmark = pytest.mark.azurite


@pytest.fixture
def azure(azurite_conn: str, unique_name: str) -> list[str]:
    queues = QueueServiceClient.from_connection_string(azurite_conn)
    queues.create_queue(unique_name)
    result = run("azure", "setup", "--connection-string", azurite_conn, "--endpoint", unique_name)
    assert result.exit_code == 0, result.output
    return ["--cloud", "azure", "--connection-string", azurite_conn, "--endpoint", unique_name]


def test_send_routes_pending_is_exact_reschedule_and_cancel(azure: list[str], unique_name: str) -> None:
    q = unique_name
    native = ok_json("send", *azure, "--to", q, "--delay", "2h", "--body", "n")
    assert native["route"] == "azure-native" and native["table"] is None
    far = ok_json("send", *azure, "--to", q, "--delay", "40d", "--body", "f", "-H", "type=Reminder")
    assert far["route"] == "azure-table" and far["table"].startswith("delays")
    soon = ok_json("send", *azure, "--to", q, "--delay", "3h", "--body", "c", "--cancellable", "--id", "move-me")
    assert soon["route"] == "azure-table" and soon["message_id"] == "move-me"

    data = ok_json("pending", *azure, "--by", "day")
    assert data["pending"] == 2 and data["oldest_overdue_seconds"] == 0  # the native one is not in the table
    assert data["claimed_or_retrying"] == 0
    assert datetime.fromisoformat(data["next_due"]) == datetime.fromisoformat(soon["due_at"])
    assert sum(b["count"] for b in data["backlog"]) == 2 and "native" in data["limits"]
    assert data["error_queue"] == "error" and data["error_queue_messages"] is not None

    later = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    moved = ok_json("reschedule", "move-me", *azure, "--at", later.isoformat())
    assert moved["route"] == "azure"
    data = ok_json("pending", *azure)
    assert datetime.fromisoformat(data["next_due"]) == later and data["oldest_overdue_seconds"] == 0
    at = (datetime.now(UTC) - timedelta(hours=2)).replace(microsecond=0)
    one_line_error(run("reschedule", "move-me", *azure, "--at", at.isoformat()), "is in the past")
    assert datetime.fromisoformat(ok_json("pending", *azure)["next_due"]) == later  # the refusal moved nothing

    # an overdue row (sent with --at in the past, kept in the table because it is cancellable)
    late = ok_json("send", *azure, "--to", q, "--at", at.isoformat(), "--body", "c", "--cancellable", "--id", "keep-me")
    assert late["route"] == "azure-table" and late["message_id"] == "keep-me"
    data = ok_json("pending", *azure)
    assert data["pending"] == 3 and datetime.fromisoformat(data["next_due"]) == at
    assert 7000 < data["oldest_overdue_seconds"] < 7400
    # a dispatcher claims the overdue one: still pending (and still overdue) until it is sent, now shown as claimed
    store = TableDelayedMessageStore.from_connection_string(azure[3], far["table"])
    [claimed] = store.fetch_due(datetime.now(UTC), 10)
    assert claimed.message_id == "keep-me"
    data = ok_json("pending", *azure)
    assert data["pending"] == 3 and data["claimed_or_retrying"] == 1 and data["oldest_overdue_seconds"] > 7000

    in_flight = run("cancel", "keep-me", *azure)  # the dispatcher may be sending it (docs/identity.md)
    assert in_flight.exit_code != 0 and "right now" in in_flight.output
    assert store.count_unsent_failure("keep-me", claim_of(claimed) or "")  # its send was refused: claim released
    assert ok_json("cancel", "keep-me", *azure)["cancelled"] is True
    assert ok_json("pending", *azure)["pending"] == 2
    one_line_error(run("cancel", "keep-me", *azure), "no pending message 'keep-me'", "--cancellable")
    one_line_error(run("reschedule", "keep-me", "--delay", "1h", *azure), "no pending message")
    text = run("pending", *azure, "--by", "hour")
    assert text.exit_code == 0 and "pending: 2" in text.stdout


def test_unknown_queue_writes_nothing(azure: list[str]) -> None:
    one_line_error(run("send", *azure, "--to", "no-such-queue", "--delay", "40d", "--body", "a"), "unknown queue")
    assert ok_json("pending", *azure)["pending"] == 0


def test_invalid_queue_name(azure: list[str]) -> None:
    one_line_error(run("send", *azure, "--to", "Bad_Name", "--delay", "1h", "--body", "a"))


def test_unknown_endpoint_table(azurite_conn: str, unique_name: str) -> None:
    args = ["--cloud", "azure", "--connection-string", azurite_conn, "--endpoint", "never-set-up"]
    one_line_error(run("pending", *args), "does not exist", "azure setup")
    one_line_error(run("cancel", "x", *args), "does not exist")
    queues = QueueServiceClient.from_connection_string(azurite_conn)
    queues.create_queue(unique_name)
    one_line_error(run("send", *args, "--to", unique_name, "--delay", "40d", "--body", "a"), "azure setup")
    assert ok_json("send", *args, "--to", unique_name, "--delay", "1h", "--body", "a")["route"] == "azure-native"


def test_use_development_storage_is_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    from delayed_delivery.app.routes import AzureTableRoute, CloudOptions

    route = AzureTableRoute(CloudOptions("azure", connection_string="UseDevelopmentStorage=true", endpoint="x"))
    assert route.config.connection_string is not None and "127.0.0.1:10002" in route.config.connection_string
