"""The effectively-once contract on an Azure Table (Azurite): conditional insert, ETag take-over."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ServiceRequestError

from delayed_delivery.azure.idempotency import (
    COMPLETED,
    MAX_RESULT_CHARS,
    TableProcessedLog,
    effectively_once,
    table_key,
)
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.idempotency import Claim, InProgress, ProcessingInProgressError, once
from delayed_delivery.testing.idempotency_contract import Fault, OnceContract, ProcessedLogContract
from tests.azure.conftest import new_name
from tests.fixtures.azurite import Azurite


@pytest.fixture
def table_log(azurite: Azurite) -> Iterator[TableProcessedLog]:
    """A processed log on a fresh table."""
    log = TableProcessedLog.from_connection_string(azurite.connection_string, new_name("once"), name="orders")
    log.setup_infrastructure()
    yield log
    log.drop()


class TestTableEffectivelyOnce(OnceContract):
    """On a manual clock: records expire when the test says, never because the machine was slow (a 1 s expiry
    lapsed between two copies of one id on a busy machine before #23)."""

    oversized_result_chars = 40_000  # storage's 400 "property value exceeds the maximum allowed size" before #23

    @pytest.fixture
    def processed_log(self, table_log: TableProcessedLog) -> TableProcessedLog:
        self.table_log, self.faults = table_log, _CompletionFaults(table_log)
        return table_log

    def fail_completions(self, times: int, fault: Fault) -> None:
        self.faults.fail(times, fault)

    def forget(self, key: str) -> None:
        self.table_log.table.delete_entity(table_key(key), table_key(self.table_log.name))


class _CompletionFaults:
    """Makes the table client's next writes of a completed row fail as the storage service would."""

    def __init__(self, log: TableProcessedLog) -> None:
        self.left, self.fault = 0, "transient"
        update = log.table.update_entity

        def failing_update(entity: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            if self.left and entity.get("Status") == COMPLETED:
                self.left -= 1
                if self.fault == "transient":
                    raise ServiceRequestError("connection reset (injected)")
                refused = HttpResponseError("The property value exceeds the maximum allowed size (injected)")
                refused.status_code = 400
                raise refused
            return update(entity, *args, **kwargs)

        log.table.update_entity = failing_update  # type: ignore[method-assign]

    def fail(self, times: int, fault: Fault) -> None:
        self.left, self.fault = times, fault


class TestTableProcessedLog(ProcessedLogContract):
    @pytest.fixture
    def log(self, table_log: TableProcessedLog) -> TableProcessedLog:
        return table_log


def test_the_decorator_keys_by_the_first_argument(table_log: TableProcessedLog) -> None:
    charged: list[tuple[str, int]] = []

    @effectively_once(table_log, expires_after=3600)
    def charge(message_id: str, amount: int) -> dict[str, Any]:
        charged.append((message_id, amount))
        return {"charged": amount}

    assert charge("order-1", 5) == {"charged": 5}
    assert charge("order-1", 7) == {"charged": 5}
    assert charge("order-2", 7) == {"charged": 7}
    assert charged == [("order-1", 5), ("order-2", 7)]


def test_two_consumers_on_one_table_keep_their_own_records(azurite: Azurite, table_log: TableProcessedLog) -> None:
    shipping = TableProcessedLog.from_connection_string(
        azurite.connection_string, table_log.table.table_name, name="shipping"
    )
    effects: list[str] = []
    once(table_log, "order-1", lambda: effects.append("bill"))
    once(shipping, "order-1", lambda: effects.append("ship"))
    once(table_log, "order-1", lambda: effects.append("bill again"))
    assert effects == ["bill", "ship"]


def test_an_attempt_that_died_holds_the_id_only_for_its_in_progress_timeout(table_log: TableProcessedLog) -> None:
    clock = ManualClock()
    now = clock.now()
    assert isinstance(table_log.begin("order-1", now=now, in_progress_until=now + timedelta(seconds=30)), Claim)
    effects: list[str] = []
    clock.advance(29)
    with pytest.raises(ProcessingInProgressError):
        once(table_log, "order-1", lambda: effects.append("too early"), clock=clock)
    clock.advance(2)
    once(table_log, "order-1", lambda: effects.append("taken over"), clock=clock)
    assert effects == ["taken over"]


def test_the_longest_result_a_row_holds_is_stored(table_log: TableProcessedLog) -> None:
    """``MAX_RESULT_CHARS`` is what storage takes: one character more was a 400 from the service."""
    text = "s" * (MAX_RESULT_CHARS - 2)  # the JSON string adds two quotes
    assert once(table_log, "order-1", lambda: text) == text
    assert once(table_log, "order-1", lambda: "again") == text
    row = table_log.table.get_entity(table_key("order-1"), table_key(table_log.name))
    assert len(row["Result"]) == MAX_RESULT_CHARS
    with pytest.raises(HttpResponseError, match="maximum allowed size"):
        table_log.table.upsert_entity({**row, "Result": "s" * (MAX_RESULT_CHARS + 1)})


def test_two_attempts_taking_over_one_ended_hold_get_one_claim(table_log: TableProcessedLog) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    table_log.begin("order-1", now=t0, in_progress_until=t0 + timedelta(seconds=1))
    later = t0 + timedelta(seconds=5)
    first = table_log.begin("order-1", now=later, in_progress_until=later + timedelta(seconds=30))
    second = table_log.begin("order-1", now=later, in_progress_until=later + timedelta(seconds=30))
    assert isinstance(first, Claim)
    assert isinstance(second, InProgress)


def test_table_keys_escape_reserved_characters_and_hash_long_ids() -> None:
    assert table_key("order-17") == "order-17"
    assert table_key("a/b#c?d\\e%f~g") == "a%2Fb%23c%3Fd%5Ce%25f%7Eg"
    long = table_key("x" * 300)
    assert long.startswith("~") and len(long) == 65
    assert table_key("x" * 300) != table_key("x" * 301)


def test_a_missing_table_is_a_configuration_error(azurite: Azurite) -> None:
    log = TableProcessedLog.from_connection_string(azurite.connection_string, new_name("missing"))
    with pytest.raises(ConfigurationError):
        once(log, "order-1", lambda: None)


def test_an_empty_consumer_name_is_refused(table_log: TableProcessedLog) -> None:
    with pytest.raises(ConfigurationError):
        TableProcessedLog(table_log.table, name="")
