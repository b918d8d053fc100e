"""The store contract across processes: several processes sharing one store never claim the same message.

Add ``MultiProcessStoreContract`` (and a picklable ``store_factory`` fixture) beside ``StoreContract``.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from ..ports import DelayedMessageStore, claim_of
from .store_contract_tools import T0, msg, secs

__all__ = ["MultiProcessStoreContract"]


def _claim_worker(
    factory: Callable[[], DelayedMessageStore], at: datetime, start: Any, results: Any, worker: int
) -> None:
    store = factory()
    start.wait(60)  # every process is up and connected before anyone claims
    claimed: list[str] = []
    while True:
        batch = store.fetch_due(at, 5)
        if not batch:
            break
        claimed.extend(m.message_id for m in batch)
        time.sleep(0.005)  # a real dispatcher sends between claim and remove; let the others in
        for m in batch:
            store.remove(m.message_id, claim_of(m))
    results.put((worker, claimed))


class MultiProcessStoreContract:
    """For stores shared across processes; provide ``store`` and a picklable ``store_factory`` fixture."""

    #: How many processes race for claims.
    processes: int = 4
    #: How many messages they share.
    messages: int = 400

    @pytest.fixture
    def store_factory(self) -> Callable[[], DelayedMessageStore]:
        raise NotImplementedError("define a `store_factory` fixture: a picklable callable returning the store")

    def test_processes_never_claim_the_same_message(
        self, store: DelayedMessageStore, store_factory: Callable[[], DelayedMessageStore]
    ) -> None:
        for i in range(self.messages):
            store.store(msg(i, T0 + secs(i % 23)))
        ctx = multiprocessing.get_context("spawn")
        start = ctx.Barrier(self.processes)
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=_claim_worker, args=(store_factory, T0 + secs(100), start, queue, n))
            for n in range(self.processes)
        ]
        for p in procs:
            p.start()
        results = [queue.get(timeout=120)[1] for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        everything = [i for r in results for i in r]
        assert len(everything) == self.messages, "every message is claimed once"
        assert len(set(everything)) == self.messages, "no message is claimed by two processes"
        assert sum(1 for r in results if r) >= 2, f"the processes really competed: {[len(r) for r in results]}"
        assert store.next_due() is None
