"""Today's writers, given the fixed inputs, still write exactly the golden files (a format change is noticed).

A missing golden is written and the test fails once, so a new file is always looked at before it is committed.
When a writer changes on purpose, add a new version beside the old file; the reader tests keep the old one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.golden import captures, wire

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


def _check(name: str, value: Any) -> None:
    path = wire.GOLDEN / name
    text = wire.dumps(value)
    if not path.exists():
        path.write_text(text, encoding="utf-8")
        pytest.fail(f"wrote the new golden file {name}: review it, commit it and run again")
    assert json.loads(text) == json.loads(path.read_text(encoding="utf-8")), f"the writer no longer writes {name}"


@pytest.mark.moto
def test_sqs_sender_writes_the_golden_send_requests(sqs: SQSClient) -> None:
    _check("sqs_send.v1.json", captures.sqs_send(sqs))


@pytest.mark.moto
def test_sqs_requeue_writes_the_golden_hop_and_forward(sqs: SQSClient) -> None:
    _check("sqs_requeue.v1.json", captures.sqs_requeue(sqs))


@pytest.mark.moto
def test_sqs_envelopes_are_the_golden_ones(sqs: SQSClient) -> None:
    _check("sqs_envelope.v1.json", captures.sqs_envelope(sqs))


@pytest.mark.moto
def test_sqs_error_queue_attributes_are_the_golden_ones(sqs: SQSClient) -> None:
    _check("sqs_error_queue.v1.json", captures.sqs_error_queue(sqs))


def test_azure_queue_envelope_is_the_golden_one() -> None:
    _check("azure_queue.v1.json", captures.azure_queue())


def test_azure_table_rows_are_the_golden_ones() -> None:
    _check("azure_table.v1.json", captures.azure_table())


def test_sqlite_row_is_the_golden_one(tmp_path: Path) -> None:
    _check("sqlite_row.v1.json", captures.sqlite_row(tmp_path))


@pytest.mark.postgres
def test_postgres_row_is_the_golden_one(postgres_conninfo: str, postgres_table: str) -> None:
    value = captures.postgres_row(postgres_conninfo, postgres_table)
    _check("postgres_row.v1.json", value)
