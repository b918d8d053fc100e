"""Issue 26's small things, one test each: tables in a pipe, due times to the second, no ``<bool>`` metavars,
unit words in durations, ``--at`` in the past, which queue attribute differs, an unknown region on an emulator, and
short Azure connection errors."""

from __future__ import annotations

import io
import re
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.table import Table

from delayed_delivery.app.cli import build_command
from delayed_delivery.app.cli.output import plain_console, print_table
from delayed_delivery.durations import parse_duration
from tests.app.cli.conftest import ok_json, one_line_error, run


def test_a_table_into_a_pipe_keeps_each_row_on_one_line() -> None:
    table = Table(title="wide")
    table.add_column("measure")
    table.add_column("value")
    long = "rescheduled (arrived after the new due) " * 3
    table.add_row(long, "1 (+0.4 s)")
    sink = io.StringIO()
    print_table(table, plain_console(file=sink))  # a StringIO is no terminal: 80 columns unless we say otherwise
    rows = [line for line in sink.getvalue().splitlines() if "rescheduled" in line]
    assert len(rows) == 1 and long.strip() in rows[0] and "1 (+0.4 s)" in rows[0]


def test_the_core_demo_summary_in_a_pipe_is_not_wrapped() -> None:
    result = run("demo", "--core", "--quick", "--messages", "20")
    assert result.exit_code in (0, 1), result.output  # 1: the demo's own verdict (a loaded machine), not the table's
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "sent by dispatcher" in line)
    # Every dispatcher that sent (a loaded machine may leave one idle) is counted on the row's own line, none below.
    assert re.search(r"dispatcher-\d+: \d+", lines[at]), lines[at]
    assert "dispatcher-" not in lines[at + 1], lines[at : at + 2]


def test_due_times_print_to_the_second(tmp_path: Path) -> None:
    store = ["--store", f"sqlite:///{tmp_path / 'd.db'}"]
    text = run("send", *store, "--to", "orders", "--delay", "2h", "--body", "x", "--id", "a").stdout
    assert re.search(r" at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 \(route: store\)$", text.strip()), text
    moved = run("reschedule", "a", *store, "--delay", "3h").stdout
    assert re.search(r"to \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 \(route", moved), moved
    assert "." in ok_json("send", *store, "--to", "orders", "--delay", "2h", "--body", "y", "--id", "b")["due_at"]


def _leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    subs = getattr(command, "commands", {})
    yield path
    for name, sub in subs.items():
        yield from _leaves(sub, (*path, name))


def test_no_command_shows_a_bool_metavar(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from delayed_delivery.app.entry import main

    monkeypatch.setenv("COLUMNS", "200")
    checked = 0
    for path in _leaves(build_command()):
        monkeypatch.setattr(sys, "argv", ["delayed-delivery", *path, "--help"])
        with pytest.raises(SystemExit):
            main()
        shown = capsys.readouterr().out
        assert "--help" in shown and "<bool>" not in shown, (path, shown)
        checked += 1
    assert checked >= 20


WORDS = [("40 days", 40 * 86_400), ("5 m", 300), ("2 hours 30 minutes", 9000), ("1 year", 31_557_600),
         ("90 seconds", 90), ("3 wks", 21 * 86_400)]  # fmt: skip


@pytest.mark.parametrize(("words", "seconds"), WORDS)
def test_durations_take_unit_words_as_they_take_letters(words: str, seconds: int, tmp_path: Path) -> None:
    assert parse_duration(words).total_seconds() == seconds
    store = ["--store", f"sqlite:///{tmp_path / 'd.db'}"]
    sent = ok_json("send", *store, "--to", "orders", "--delay", words, "--body", "x")
    due = datetime.fromisoformat(sent["due_at"])
    assert abs((due - datetime.now(UTC)).total_seconds() - seconds) < 60
    one_line_error(run("cost", "--delay", "40 dayz"), "'40 dayz'")


def test_at_in_the_past_says_so_and_sends_at_once(tmp_path: Path) -> None:
    past = (datetime.now(UTC) - timedelta(hours=3)).replace(microsecond=0).isoformat()
    result = run("send", "--store", f"sqlite:///{tmp_path / 'd.db'}", "--to", "orders", "--at", past, "--body", "x")
    assert result.exit_code == 0, result.output
    said = rf"warning: --at {re.escape(past)} is 3h( \d+[ms])* in the past: it is due now \(it goes out at once\)"
    assert re.fullmatch(said, result.stderr.strip()), result.stderr


@pytest.mark.moto
def test_an_existing_queue_with_other_attributes_is_named_with_the_difference(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = ["--endpoint-url", moto_endpoint, "--region", "us-east-1", "--no-buckets"]
    assert run("aws", "create", "--queue", "orders", *where).exit_code == 0
    monkeypatch.setenv("DELAYED_DELIVERY_FIFO_QUEUE_DELAY", "2")
    one_line_error(
        run("aws", "create", "--queue", "orders", *where),
        "queue 'orders-delay.fifo' already exists with other attributes: DelaySeconds is 900, wanted 2 "
        "(DELAYED_DELIVERY_FIFO_QUEUE_DELAY)",
    )


@pytest.mark.moto
def test_a_drifted_ingest_queue_is_named_with_the_difference_and_the_command_that_sets_it_back(
    moto_endpoint: str,
) -> None:
    """Before (issue 32), ``aws create --buckets`` on a drifted ingest queue printed SQS's raw QueueAlreadyExists."""
    import boto3

    where = ["--endpoint-url", moto_endpoint, "--region", "us-east-1", "--buckets"]
    assert run("aws", "create", "--queue", "orders", *where).exit_code == 0
    assert run("aws", "create", "--queue", "orders", *where).exit_code == 0  # the same again: nothing to say
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    url = sqs.get_queue_url(QueueName="delayed-delivery-ingest")["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"MessageRetentionPeriod": "60"})
    line = one_line_error(
        run("aws", "create", "--queue", "orders", *where),
        "queue 'delayed-delivery-ingest' already exists with other attributes: MessageRetentionPeriod is 60, "
        "wanted 1209600",
        f'aws sqs set-queue-attributes --queue-url {url} --attributes \'{{"MessageRetentionPeriod": "1209600"}}\'',
    )
    assert "QueueAlreadyExists" not in line


@pytest.mark.moto
def test_a_region_aws_does_not_have_is_one_line_on_an_emulator(moto_endpoint: str) -> None:
    for args in (["pending", "--cloud", "aws", "--endpoint-url", moto_endpoint],
                 ["aws", "check", "--queue", "orders", "--endpoint-url", moto_endpoint]):  # fmt: skip
        line = one_line_error(run(*args, "--region", "eu-west-9"), "unknown AWS region 'eu-west-9'")
        assert "<" not in line and "emulators up" not in line


def test_an_unreachable_azure_endpoint_is_a_short_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        connection = (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
            f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;QueueEndpoint=http://127.0.0.1:{port}/"
            f"devstoreaccount1;TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
        )
        line = one_line_error(
            run("pending", "--cloud", "azure", "--connection-string", connection, "--endpoint", "shop"),
            f"cannot connect to 127.0.0.1:{port}",
        )
    assert len(line) < 200 and "HTTPConnectionPool" not in line and "Max retries" not in line, line
