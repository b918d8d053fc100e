"""Today's writers, given the fixed inputs, still write exactly the newest golden file of each kind.

A format change is noticed here. When it is meant, run with ``GOLDEN_ADD_VERSION=1``: the next version is written
beside the old ones (never over them) and the test fails once, so the new file is looked at before it is committed.
``test_readers.py`` reads every version, old and new.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.golden import captures, wire

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


def _check(kind: str, value: Any) -> None:
    text = wire.dumps(value)
    known = wire.versions(kind)
    if known and json.loads(text) == json.loads((wire.GOLDEN / known[-1]).read_text(encoding="utf-8")):
        return
    name = f"{kind}.v{wire.version_of(known[-1]) + 1 if known else 1}.json"
    if known and not os.environ.get("GOLDEN_ADD_VERSION"):
        pytest.fail(
            f"today's writer no longer writes {known[-1]}: messages in that format may still be waiting, so "
            f"test_readers.py must keep reading it. If the change is meant, run with GOLDEN_ADD_VERSION=1 to add "
            f"{name} beside it (never edit a golden file)"
        )
    (wire.GOLDEN / name).write_text(text, encoding="utf-8")
    pytest.fail(f"wrote the new golden file {name}: review it, commit it and run again")


@pytest.mark.moto
def test_sqs_sender_writes_the_golden_send_requests(sqs: SQSClient) -> None:
    _check("sqs_send", captures.sqs_send(sqs))


@pytest.mark.moto
def test_sqs_requeue_writes_the_golden_hop_and_forward(sqs: SQSClient) -> None:
    _check("sqs_requeue", captures.sqs_requeue(sqs))


@pytest.mark.moto
def test_sqs_envelopes_are_the_golden_ones(sqs: SQSClient) -> None:
    _check("sqs_envelope", captures.sqs_envelope(sqs))


@pytest.mark.moto
def test_sqs_ingest_envelopes_are_the_golden_ones(sqs: SQSClient) -> None:
    _check("sqs_ingest", captures.sqs_ingest(sqs))


@pytest.mark.moto
def test_sqs_error_queue_attributes_are_the_golden_ones(sqs: SQSClient) -> None:
    _check("sqs_error_queue", captures.sqs_error_queue(sqs))


def test_azure_queue_envelope_is_the_golden_one() -> None:
    _check("azure_queue", captures.azure_queue())


def test_azure_table_rows_are_the_golden_ones() -> None:
    _check("azure_table", captures.azure_table())


def test_azure_deferred_rows_are_the_golden_ones() -> None:
    _check("azure_table_deferred", captures.azure_table_deferred())


def test_azure_placed_row_is_the_golden_one() -> None:
    _check("azure_table_placed", captures.azure_table_placed())


def test_azure_placing_rows_are_the_golden_ones() -> None:
    _check("azure_table_placing", captures.azure_table_placing())


def test_azure_sending_rows_are_the_golden_ones() -> None:
    _check("azure_table_sending", captures.azure_table_sending())


def test_azure_table_layout_is_the_golden_one() -> None:
    _check("azure_table_layout", captures.azure_table_layout())


def test_sqlite_row_is_the_golden_one(tmp_path: Path) -> None:
    _check("sqlite_row", captures.sqlite_row(tmp_path))


@pytest.mark.postgres
def test_postgres_row_is_the_golden_one(postgres_conninfo: str, postgres_table: str) -> None:
    value = captures.postgres_row(postgres_conninfo, postgres_table)
    _check("postgres_row", value)
