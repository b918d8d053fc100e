"""What an operator types, read as meant: ``reschedule --delay`` and ``send --delay`` count from the write (not from
before the command connected), "100 years" is one limit in every spelling, and an id that looks like an option gets
the hint to put ``--`` before it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.app.routes import azure as azure_route
from delayed_delivery.app.routes import sqs as sqs_route
from delayed_delivery.app.routes import store as store_route
from delayed_delivery.clock import SystemClock
from tests.app.cli.conftest import ok_json, one_line_error, run

#: How long the command takes to connect in these tests: a loaded machine, a far region, a cold SDK import.
SLOW = timedelta(seconds=5)


@pytest.fixture
def slow_connection(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """The command's clock: real time, and ``SLOW`` later once ``connected()`` is called (no sleeping)."""
    ahead = [timedelta(0)]
    real_now = SystemClock.now
    monkeypatch.setattr(SystemClock, "now", lambda self: real_now(self) + ahead[0])

    def connected() -> None:
        ahead[0] = SLOW

    return connected


def _wrap(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, then: Callable[[], None]) -> None:
    """``owner.name`` calls ``then`` after it has done its work (the connection is made)."""
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        then()
        return result

    monkeypatch.setattr(owner, name, wrapped)


def _moved_after_the_write(moved: dict[str, Any]) -> None:
    """The new due time is 1 s after the write, which came ``SLOW`` after the command started."""
    due = datetime.fromisoformat(moved["due_at"])
    assert due - datetime.now(UTC) >= SLOW + timedelta(seconds=0.5), moved


def test_reschedule_delay_counts_from_the_write_on_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_connection: Callable[[], None]
) -> None:
    """Before: the due time was fixed before the store was opened, so after a 5 s connection ``--delay 1s`` moved the
    message to a time already 4 s past (it went out at once)."""
    store = ["--store", f"sqlite:///{tmp_path / 'd.db'}"]
    ok_json("send", *store, "--to", "orders", "--delay", "1h", "--body", "x", "--id", "m1")
    _wrap(monkeypatch, store_route, "open_store", slow_connection)
    _moved_after_the_write(ok_json("reschedule", "m1", *store, "--delay", "1s"))


@pytest.mark.azurite
def test_reschedule_delay_counts_from_the_write_on_azure(
    azurite_conn: str, unique_name: str, monkeypatch: pytest.MonkeyPatch, slow_connection: Callable[[], None]
) -> None:
    QueueServiceClient.from_connection_string(azurite_conn).create_queue(unique_name)
    azure = ["--cloud", "azure", "--connection-string", azurite_conn, "--endpoint", unique_name]
    assert run("azure", "setup", "--connection-string", azurite_conn, "--endpoint", unique_name).exit_code == 0
    ok_json("send", *azure, "--to", unique_name, "--delay", "40d", "--body", "x", "--id", "m2")
    _wrap(monkeypatch, azure_route.AzureTableRoute, "_check_table", slow_connection)
    _moved_after_the_write(ok_json("reschedule", "m2", *azure, "--delay", "1s"))


def test_send_delay_counts_from_the_write_on_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_connection: Callable[[], None]
) -> None:
    _wrap(monkeypatch, store_route, "open_store", slow_connection)
    store = ["--store", f"sqlite:///{tmp_path / 'd.db'}"]
    _moved_after_the_write(ok_json("send", *store, "--to", "orders", "--delay", "1s", "--body", "x"))


@pytest.mark.moto
def test_send_delay_counts_from_the_write_on_sqs(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, slow_connection: Callable[[], None]
) -> None:
    """Before: the SQS route sent DelaySeconds = what was left of the delay after connecting (5 s: 0, and a
    ``--delay 5s`` meant for the -delay.fifo route went native under load)."""
    aws = ["--cloud", "aws", "--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    assert run("aws", "create", "--queue", "orders", *aws[2:]).exit_code == 0
    _wrap(monkeypatch, sqs_route, "cli_client", slow_connection)
    sent = ok_json("send", *aws, "--to", "orders", "--delay", "5s", "--body", "x")
    assert sent["route"] == "sqs-native" and sent["delay_seconds"] == 5, sent


def test_reschedule_refuses_a_zero_delay_before_connecting(tmp_path: Path) -> None:
    one_line_error(
        run("reschedule", "m", "--store", f"sqlite:///{tmp_path / 'd.db'}", "--delay", "0"), "later than now"
    )


@pytest.mark.parametrize("spelling", ["100y", "100 years", "36525d", "876600h"])
def test_100_years_is_the_limit_in_every_spelling(spelling: str, tmp_path: Path) -> None:
    store = ["--store", f"sqlite:///{tmp_path / 'd.db'}"]
    sent = ok_json("send", *store, "--to", "orders", "--delay", spelling, "--body", "x")
    years = (datetime.fromisoformat(sent["due_at"]) - datetime.now(UTC)) / timedelta(days=365.25)
    assert 99.99 < years <= 100, sent
    refused = run("send", *store, "--to", "orders", "--delay", f"{spelling} 1s", "--body", "x")
    one_line_error(refused, "100-year maximum")


def test_an_at_100_calendar_years_ahead_is_within_the_limit(tmp_path: Path) -> None:
    store = ["--store", f"sqlite:///{tmp_path / 'd.db'}"]
    now = datetime.now(UTC) + timedelta(minutes=1)
    ahead = now.replace(year=now.year + 100, day=min(now.day, 28))
    ok_json("send", *store, "--to", "orders", "--at", ahead.isoformat(), "--body", "x", "--id", "far")
    moved = ok_json("reschedule", "far", *store, "--at", ahead.isoformat())
    assert datetime.fromisoformat(moved["due_at"]) == ahead


@pytest.mark.parametrize("command", [["cancel"], ["reschedule", "--delay", "1h"]])
def test_an_id_that_looks_like_an_option_gets_the_hint_to_put_dashes_before_it(
    command: list[str], tmp_path: Path
) -> None:
    store = ["--store", f"sqlite:///{tmp_path / 'd.db'}"]
    result = run(command[0], "-abc", *store, *command[1:])
    said = " ".join(result.stderr.replace("│", " ").split())
    assert result.exit_code == 2 and "No such option" in said, result.output
    assert f"If '-abc' is a message id, put -- before it: delayed-delivery {command[0]} [OPTIONS] -- -abc" in said
    ok_json("send", *store, "--to", "orders", "--delay", "1h", "--body", "x", "--id", "-abc")
    assert run(command[0], *store, *command[1:], "--", "-abc").exit_code == 0  # the hint works


def test_a_typo_of_a_known_option_keeps_clicks_suggestion(tmp_path: Path) -> None:
    result = run("cancel", "m", "--store", f"sqlite:///{tmp_path / 'd.db'}", "--jsn")
    assert result.exit_code == 2 and "--json" in result.stderr and "put --" not in result.stderr, result.output
