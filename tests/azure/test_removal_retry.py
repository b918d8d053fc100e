"""A removal transaction that fails transiently is retried, its rows' claims kept: no duplicate without a crash.

``$batch`` is a POST the SDK does not retry, so a reset connection failed the whole delete transaction; the rows,
sent already, were given back at the end of the run and sent again by the next one (the issue saw up to 100 per
failure). Here the first three delete transactions of the real ``AzureDispatcherHost`` fail with a reset
connection; every message must still arrive exactly once over two runs, and the table end empty.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure import transactions
from delayed_delivery.model import DelayedMessage
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.test_dispatch import make_host
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


def test_a_reset_delete_transaction_is_retried_and_nothing_is_sent_twice(
    azurite: Azurite, queues: QueueServiceClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = transactions.submit
    failures = {"left": 3}
    lock = threading.Lock()

    def flaky(table: Any, operations: Sequence[Any]) -> list[str | None]:
        if operations and all(op[0] == "delete" for op in operations):
            with lock:
                fail = failures["left"] > 0
                failures["left"] -= fail
            if fail:
                raise ServiceResponseError("Connection aborted: ConnectionResetError(104, 'Connection reset by peer')")
        return real(table, operations)

    monkeypatch.setattr(transactions, "submit", flaky)
    host = make_host(azurite.connection_string, new_name(), error_queue=new_name("e"), run=4.0)
    due = datetime.now(UTC) - timedelta(seconds=1)
    host.store.store_many([DelayedMessage(f"m-{i}", queue, b"x", due) for i in range(250)])

    first = host.run()
    second = host.run(budget=2.0)

    assert failures["left"] == 0, "the faults were injected"
    arrived = Counter(e.message_id for e in drain(queues, queue))
    assert len(arrived) == 250, "every message arrived"
    assert [mid for mid, n in arrived.items() if n > 1] == [], "none twice"
    assert first.dispatched + second.dispatched == 250 and host.store.count() == 0
