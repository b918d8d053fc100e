"""#15 findings 7 and 8: what users get wrong (or what is broken around them) is one ``error:`` line and exit 2,
quickly: unusable SQLite files, oversized or endless bodies, far due times, bad queue names, secrets in URLs and
connection strings, a missing region, unreachable endpoints, and a message id that is taken or in flight."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.app.cli import _configure_logging
from delayed_delivery.app.stores import open_store
from delayed_delivery.errors import MessageIdConflictError, MessageInFlightError
from delayed_delivery.model import DelayedMessage
from tests.app.cli.conftest import one_line_error, run
from tests.fixtures.services import free_port

SEND = ("--to", "orders", "--delay", "1h", "--body", "a")


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A SQLite store with its table made."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    open_store(url).close()  # type: ignore[attr-defined]
    return url


@pytest.fixture
def read_only(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After ``store_url`` is made, SQLite opens every file read-only, as for a file its user may not write."""
    real = sqlite3.connect

    def connect(path: str, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real(f"file:{path}?mode=ro", *args, uri=True, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)


# -- SQLite files the store cannot use ----------------------------------------


@pytest.mark.usefixtures("read_only")
def test_read_only_sqlite_file_send_and_cancel(store_url: str) -> None:
    one_line_error(run("send", "--store", store_url, *SEND), "read-only", "d.db")
    one_line_error(run("cancel", "some-id", "--store", store_url), "read-only", "d.db")
    one_line_error(run("reschedule", "some-id", "--delay", "2h", "--store", store_url), "read-only")


def test_table_with_another_schema(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE delayed_messages (x INTEGER)")
    for command in (["send", *SEND], ["pending"], ["cancel", "x"]):
        one_line_error(run(*command, "--store", f"sqlite:///{path}"), "delayed_messages", "other.db", "schema")


def test_dev_null_is_no_sqlite_file() -> None:
    one_line_error(run("send", "--store", "sqlite:////dev/null", *SEND), "/dev/null", "not a usable SQLite")


def test_a_file_that_is_not_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "text.db"
    path.write_text("not a database, just text " * 100)
    one_line_error(run("pending", "--store", f"sqlite:///{path}"), "text.db", "not a database")


# -- secrets are never echoed -----------------------------------------------------


def test_store_url_password_is_redacted() -> None:
    line = one_line_error(run("pending", "--store", "mysql://alice:hunter2@db.example/app"), "alice:***@db.example")
    assert "hunter2" not in line


@pytest.mark.parametrize(
    "connection",
    [
        "garbage;AccountKey=c2VjcmV0a2V5",
        "AccountKey=c2VjcmV0a2V5",  # no account, no endpoints
        "QueueEndpoint=http://127.0.0.1:1/a;AccountName=a;SharedAccessKey=c2VjcmV0a2V5",  # no key nor signature
        "UseDevelopmentStorage=false",
        ";;;",
    ],
)
def test_malformed_azure_connection_string(connection: str) -> None:
    for command in (["pending"], ["send", *SEND]):
        result = run(*command, "--cloud", "azure", "--connection-string", connection, "--endpoint", "shop")
        line = one_line_error(result, "connection string")
        assert "c2VjcmV0a2V5" not in result.output, line


def test_malformed_azure_connection_string_on_azure_setup() -> None:
    result = run("azure", "setup", "--connection-string", "garbage;AccountKey=c2VjcmV0a2V5", "--endpoint", "shop")
    assert result.exit_code == 2, result.output
    assert "connection string" in result.output and "c2VjcmV0a2V5" not in result.output
    assert "Traceback" not in result.output


# -- bodies, due times and destinations on the store route -----------------------------


def test_body_from_an_endless_file_stops_quickly(store_url: str) -> None:
    started = time.monotonic()
    one_line_error(
        run("send", "--store", store_url, "--to", "orders", "--delay", "1h", "--body", "@/dev/zero"), "1 MiB"
    )
    assert time.monotonic() - started < 10


def test_body_over_one_mib_is_refused_and_one_mib_is_taken(store_url: str, tmp_path: Path) -> None:
    big, limit = tmp_path / "big.bin", tmp_path / "limit.bin"
    big.write_bytes(b"x" * (1024 * 1024 + 1))
    limit.write_bytes(b"x" * (1024 * 1024))
    one_line_error(run("send", "--store", store_url, "--to", "orders", "--delay", "1h", "--body", f"@{big}"), "1 MiB")
    result = run("send", "--store", store_url, "--to", "orders", "--delay", "1h", "--body", f"@{limit}")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("at", ["2500-01-01T00:00:00Z", "9999-12-31T23:59:59Z"])
def test_due_time_past_100_years_on_the_store_route(store_url: str, at: str) -> None:
    one_line_error(run("send", "--store", store_url, "--to", "orders", "--at", at, "--body", "a"), "100-year")
    run("send", "--store", store_url, "--to", "orders", "--delay", "1h", "--body", "a", "--id", "m1")
    one_line_error(run("reschedule", "m1", "--store", store_url, "--at", at), "100-year")


@pytest.mark.parametrize("to", ["bad/name!", "orders queue", "x" * 81, "../etc"])
def test_destination_that_is_no_queue_name_on_the_store_route(store_url: str, to: str) -> None:
    one_line_error(run("send", "--store", store_url, "--to", to, "--delay", "1h", "--body", "a"), "not a queue name")


# -- a message id that is taken, or a message that is being delivered -------------------


def test_id_pending_with_other_content(store_url: str) -> None:
    send = ("send", "--store", store_url, "--to", "orders", "--at", "2030-01-01T00:00:00Z", "--id", "m1")
    assert run(*send, "--body", "a").exit_code == 0
    assert run(*send, "--body", "a").exit_code == 0  # the same message again: a no-op
    result = run(*send, "--body", "other")
    one_line_error(result, "message 'm1' is already pending with different content")


def test_message_being_delivered(store_url: str) -> None:
    store = open_store(store_url)
    store.store(DelayedMessage.create("orders", b"a", delay=timedelta(0), message_id="m2"))
    assert [m.message_id for m in store.fetch_due(datetime.now(UTC), 10)] == ["m2"]
    for command in (["cancel", "m2"], ["reschedule", "m2", "--delay", "1h"]):
        result = run(*command, "--store", store_url)
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert lines == ["error: message 'm2' is being delivered right now; try again in a few seconds"]


def test_conflict_and_in_flight_errors_exist() -> None:
    assert issubclass(MessageIdConflictError, Exception) and issubclass(MessageInFlightError, Exception)


# -- unreachable endpoints fail fast ------------------------------------------------


@pytest.fixture(params=["closed", "silent"])
def dead_port(request: pytest.FixtureRequest) -> Iterator[int]:
    """A port nothing listens on, or one that takes connections and never answers (a hung emulator)."""
    if request.param == "closed":
        yield free_port()
        return
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # the kernel completes handshakes; nobody ever reads or replies
        yield int(silent.getsockname()[1])


#: The CLI's own timeouts and retries end an unreachable endpoint in under 10 s; the rest is headroom for a loaded
#: machine (the command's imports and work are CPU). The SDKs' defaults (60 s and 300 s read timeouts against a silent
#: port, retried) take minutes, which this still catches.
QUICK_SECONDS = 30


def _quick(*args: str) -> str:
    started = time.monotonic()
    result = run(*args)
    line = one_line_error(result)
    assert time.monotonic() - started < QUICK_SECONDS, f"took {time.monotonic() - started:.1f} s: {line}"
    return result.output


def test_unreachable_sqs_fails_fast(dead_port: int) -> None:
    url = ("--endpoint-url", f"http://127.0.0.1:{dead_port}", "--region", "us-east-1")
    _quick("pending", "--cloud", "aws", *url)
    _quick("send", "--cloud", "aws", *url, *SEND)
    _quick("cancel", "x", "--cloud", "aws", *url, "--to", "orders")
    _quick("aws", "check", "--queue", "orders", *url)
    _quick("aws", "create", "--queue", "orders", *url)
    _quick("aws", "send", "--queue", "orders", "--delay", "40d", "--body", "a", *url)


def test_unreachable_azure_storage_fails_fast(dead_port: int) -> None:
    endpoints = "".join(f"{s}Endpoint=http://127.0.0.1:{dead_port}/acct;" for s in ("Blob", "Queue", "Table"))
    conn = f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=c2VjcmV0a2V5;{endpoints}"
    azure = ("--cloud", "azure", "--connection-string", conn, "--endpoint", "shop")
    for command in (["pending"], ["send", *SEND], ["cancel", "x"], ["reschedule", "x", "--delay", "1h"]):
        output = _quick(*command, *azure)
        assert "c2VjcmV0a2V5" not in output
    for command in (["setup"], ["send", "--queue", "orders", "--delay", "1h", "--body", "a"]):
        assert "c2VjcmV0a2V5" not in _quick("azure", *command, "--connection-string", conn, "--endpoint", "shop")


def test_unreachable_postgres_fails_fast_without_the_password(dead_port: int) -> None:
    output = _quick("pending", "--store", f"postgresql://alice:hunter2@127.0.0.1:{dead_port}/app")
    assert "hunter2" not in output


# -- a region for local endpoints -------------------------------------------------


@pytest.mark.moto
def test_aws_create_on_a_local_endpoint_without_a_region(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    result = run("aws", "create", "--queue", "orders", "--endpoint-url", moto_endpoint)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["delay"].endswith("/orders-delay.fifo")
    result = run("aws", "requeue", "--queue", "orders", "--endpoint-url", moto_endpoint, "--for", "0.5")
    assert result.exit_code == 0, result.output
    result = run("pending", "--cloud", "aws", "--endpoint-url", moto_endpoint, "--json")
    assert result.exit_code == 0 and "orders" in [q["queue"] for q in json.loads(result.stdout)["queues"]], (
        result.output
    )


def test_aws_without_a_region_on_aws_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL_SQS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    one_line_error(run("aws", "check", "--queue", "orders"), "no AWS region", "--region")
    one_line_error(run("pending", "--cloud", "aws"), "no AWS region")


def test_verbose_log_lines_mask_secrets() -> None:
    _configure_logging(verbose=True)
    handler = logging.getLogger("delayed_delivery").handlers[0]
    record = logging.LogRecord(
        "delayed_delivery.x", logging.ERROR, __file__, 1, "cannot reach %s", ("postgresql://u:hunter2@db/app",), None
    )
    line = handler.format(record)
    assert "hunter2" not in line and "u:***@db" in line
